"""trainer.json's numbers on resume (issue 41, section 5): a NaN best_val_loss was accepted
("best nan": no later loss is lower than NaN, so best/ was never saved again); each number is
what a save writes, or `train --resume` refuses in one line naming it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cli_refusal import fails
from tiny_run import TEXT, train_tiny_run

from sheepop.checkpoint import format as checkpoint
from sheepop.errors import UserError


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return train_tiny_run(tmp_path_factory.mktemp("trainer-numbers"), block_size=16)


@pytest.fixture
def copy(run, tmp_path) -> Path:
    return Path(shutil.copytree(run, tmp_path / "run"))


def set_state(run_dir: Path, **values) -> None:
    path = run_dir / checkpoint.TRAINER_JSON
    state = json.loads(path.read_text())
    state.update(values)
    path.write_text(json.dumps(state))  # (Python writes NaN and Infinity as bare words)


BAD = [("best_val_loss", float("nan"), "a finite loss >= 0 or null"),
       ("best_val_loss", float("inf"), "a finite loss >= 0 or null"),
       ("best_val_loss", -1.0, "a finite loss >= 0 or null"),
       ("best_val_loss", "2.5", "a finite loss >= 0 or null"),
       ("best_step", 1.5, "a step number or null"),
       ("evals_since_best", -3, "a count >= 0"),
       ("evals_since_best", True, "a count >= 0"),
       ("adam_step", float("nan"), "a count >= 0"),
       ("grad_scale", float("nan"), "a finite number > 0 or null"),
       ("grad_scale", 0.0, "a finite number > 0 or null")]


@pytest.mark.parametrize("name, value, what", BAD,
                         ids=[f"{n}={v!r}" for n, v, _ in BAD])
def test_a_bad_number_in_trainer_json_is_refused_by_name(copy, name, value, what):
    set_state(copy, **{name: value})
    with pytest.raises(UserError, match=rf'"{name}" is .*, not {what}; the checkpoint is '
                                        r"damaged"):
        checkpoint.load_trainer_state(copy)


def test_resume_refuses_a_nan_best_loss_in_one_line(copy, capsys):
    state = json.loads((copy / checkpoint.TRAINER_JSON).read_text())
    assert isinstance(state["best_val_loss"], float)  # (the tiny run evaluated: a real best)
    set_state(copy, best_val_loss=float("nan"))
    data = copy.parent / "data.txt"
    data.write_text(TEXT)
    fails(capsys, ["train", str(data), "--resume", "--out", str(copy), "--steps", "3"],
          '"best_val_loss" is nan, not a finite loss >= 0 or null')


def test_what_a_save_writes_is_accepted(copy):
    _, state = checkpoint.load_trainer_state(copy)
    set_state(copy, best_val_loss=None, best_step=None, grad_scale=None)
    assert checkpoint.load_trainer_state(copy)[1]["step"] == state["step"] == 2
