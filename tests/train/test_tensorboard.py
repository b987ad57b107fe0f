"""TensorBoard events (train.tensorboard, --tensorboard): the scalars of metrics.jsonl at the same
steps, read back with TensorBoard's own reader; a resumed run's events are those of an
uninterrupted one; without the package, one clear line (sheepop.train.tensorboard)."""

from __future__ import annotations

import shutil
import sys

import numpy as np
import pytest

from sheepop.errors import UserError
from sheepop.train.tensorboard import LOG_DIR, MISSING, TAGS

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import (  # noqa: E402
    EventAccumulator,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _events(run_dir) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(str(run_dir / LOG_DIR))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _from_metrics(rows) -> dict[str, list[tuple[int, float]]]:
    """What the events should hold: each metric of metrics.jsonl as float32, by step."""
    out: dict[str, list[tuple[int, float]]] = {}
    for row in rows:
        for key, tag in TAGS.items():
            if key in row:
                out.setdefault(tag, []).append((row["step"], float(np.float32(row[key]))))
    return out


def test_the_events_hold_the_metrics_at_the_same_steps(tmp_path, tiny_config, tiny_trainer,
                                                       read_metrics):
    trainer = tiny_trainer(tiny_config(tensorboard=True, log_interval=3), tmp_path / "run")
    trainer.run()
    events, rows = _events(tmp_path / "run"), read_metrics(tmp_path / "run")
    assert sorted(events) == sorted(TAGS.values())
    assert events == _from_metrics(rows)
    assert [s for s, _ in events["train/loss"]] == [3, 4, 6, 8, 9, 12]  # + the evaluations
    assert [s for s, _ in events["val/loss"]] == [4, 8, 12]


def test_a_resumed_run_has_the_events_of_an_uninterrupted_one(tmp_path, tiny_config,
                                                              tiny_trainer, interrupt_after,
                                                              read_metrics):
    straight = tiny_trainer(tiny_config(tensorboard=True), tmp_path / "a")
    straight.run()
    cfg = tiny_config(tensorboard=True, checkpoint_interval=4, keep_last=2)
    first = tiny_trainer(cfg, tmp_path / "b")
    interrupt_after(first, 6)
    first.run()
    # As if it had crashed at step 6: its last checkpoint is that of step 4, its events go on
    # to step 6; the resumed run purges steps 5 and 6 of the first event file.
    for path in (tmp_path / "b" / "checkpoints" / "step-0000004").iterdir():
        shutil.copyfile(path, tmp_path / "b" / path.name)
    resumed = tiny_trainer(cfg, tmp_path / "b", resume=True)
    assert resumed.step == 4
    resumed.run()
    assert len(list((tmp_path / "b" / LOG_DIR).iterdir())) == 2
    a, b = _events(tmp_path / "a"), _events(tmp_path / "b")
    assert [s for s, _ in b["train/loss"]] == list(range(1, 13))  # no step twice
    for tag in ("train/loss", "train/lr", "val/loss", "val/bits_per_byte"):
        assert a[tag] == b[tag], tag


def test_without_the_package_it_is_one_line_before_anything_is_written(
        tmp_path, tiny_config, tiny_trainer, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if not installed
    with pytest.raises(UserError) as e:
        tiny_trainer(tiny_config(tensorboard=True), tmp_path / "run")
    assert str(e.value) == MISSING
    assert not (tmp_path / "run" / "model.safetensors").exists()
