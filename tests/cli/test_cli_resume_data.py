"""`sheepop train --resume` trains on the data the run recorded (sheepop.data.source): it refuses,
naming it, when that data is gone or changed; other DATA given explicitly is used and said."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sheepop.cli import main
from sheepop.data import source

TINY = ["--no-progress", "--set", "model.n_layer=1", "--set", "model.n_head=2",
        "--set", "model.n_embd=16", "--set", "model.block_size=16", "--set", "train.batch_size=2",
        "--set", "train.log_interval=1", "--set", "train.eval_interval=0",
        "--set", "train.threads=1", "--set", "train.warmup_steps=1"]
WORDS = "the quick brown fox jumps over a lazy dog while seven sheep sleep " * 60


def _train(*args: str) -> int:
    return main(["train", *args, *TINY])


def _state(run: Path) -> dict:
    return json.loads((run / "trainer.json").read_text())


@pytest.fixture
def run(tmp_path) -> tuple[Path, Path]:
    """A 2-step run on my.txt, given as a relative path (recorded absolute)."""
    data = tmp_path / "my.txt"
    data.write_text(WORDS)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert _train("my.txt", "--out", str(tmp_path / "run"), "--steps", "2") == 0
    finally:
        os.chdir(cwd)
    return tmp_path / "run", data


def test_the_run_records_its_data(run):
    run_dir, data = run
    record = _state(run_dir)["data"]
    assert record["kind"] == "file" and record["path"] == str(data)
    assert record["files"] == 1 and record["bytes"] == len(WORDS)
    assert record["fingerprint"] == source.describe(data)["fingerprint"]


def test_resume_without_data_uses_the_recorded_data(run, capsys):
    run_dir, data = run
    assert _train("--resume", "--out", str(run_dir), "--steps", "4") == 0
    out = capsys.readouterr().out
    assert f"resuming on the data the run recorded: {data}" in out
    assert "standard library" not in out and "stdlib" not in out
    assert _state(run_dir)["step"] == 4


def test_resume_refuses_data_that_changed(run, capsys):
    run_dir, data = run
    data.write_text(WORDS + "one more line\n")
    assert _train("--resume", "--out", str(run_dir), "--steps", "4") == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"sheepop: error: the run trained on {data}, which changed since: give DATA "
                   "to train on it anyway")
    assert _state(run_dir)["step"] == 2
    # Given explicitly, the changed file is used, and a line says so.
    assert _train(str(data), "--resume", "--out", str(run_dir), "--steps", "3") == 0
    assert (f"note: the run trained on {data} (which changed since); continuing on {data} as "
            "asked") in capsys.readouterr().out
    assert _state(run_dir)["data"]["fingerprint"] == source.describe(data)["fingerprint"]


def test_resume_refuses_data_that_is_gone(run, capsys):
    run_dir, data = run
    data.unlink()
    assert _train("--resume", "--out", str(run_dir), "--steps", "4") == 2
    assert capsys.readouterr().err.strip() == (
        f"sheepop: error: the run trained on {data}, which is gone: give DATA to continue on "
        "other data")


def test_other_data_given_explicitly_is_used_and_said(run, tmp_path, capsys):
    run_dir, data = run
    other = tmp_path / "other"
    other.mkdir()
    (other / "a.txt").write_text(WORDS[::-1])
    assert _train(str(other), "--resume", "--out", str(run_dir), "--steps", "4") == 0
    assert (f"note: the run trained on {data} (not {other}); continuing on {other} as asked"
            in capsys.readouterr().out)
    record = _state(run_dir)["data"]  # later checkpoints record what they trained on
    assert record["kind"] == "folder" and record["path"] == str(other) and record["files"] == 1


def test_a_run_without_a_record_resumes_on_the_builtin_corpus_with_a_warning(run, capsys):
    """Runs saved before the record existed: the behaviour of those versions, said."""
    run_dir, _ = run
    state = _state(run_dir)
    del state["data"]
    (run_dir / "trainer.json").write_text(json.dumps(state))
    assert _train("--resume", "--out", str(run_dir), "--steps", "3",
                  "--set", "data.max_bytes=200000") == 0
    out = capsys.readouterr().out
    assert (f"warning: {run_dir} does not record which data it trained on (it was saved by an "
            "older sheepop): resuming on the built-in standard-library corpus") in out
    assert _state(run_dir)["data"]["kind"] == "builtin"


def test_fingerprints_see_edits_and_new_files_but_read_no_data(tmp_path):
    folder = tmp_path / "f"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "a.txt").write_text("abc")
    first = source.describe(folder)
    assert source.describe(folder) == first
    (folder / "b.txt").write_text("new")
    second = source.describe(folder)
    assert second["fingerprint"] != first["fingerprint"] and second["files"] == 2
    os.utime(folder / "b.txt", ns=(1, 1))
    assert source.describe(folder)["fingerprint"] != second["fingerprint"]
    prepared = tmp_path / "p"
    prepared.mkdir()
    (prepared / "meta.json").write_text('{"a": 1}')
    assert source.describe(prepared)["kind"] == "prepared"
    assert source.describe(None)["path"] == source.BUILTIN
