"""Following a run: plain lines when standard error is not a terminal (every train.log_interval
steps and at each evaluation, the figures of metrics.jsonl), the bar on a terminal, nothing when
asked; the run's closing words (sheepop.train.progress, sheepop.train.summary)."""

from __future__ import annotations

import io
import re

import pytest

from sheepop.train.progress import Progress, resolve_mode
from sheepop.words import duration, plural

pytestmark = pytest.mark.usefixtures("one_torch_thread")

STEP_LINE = re.compile(r"step (\d+)/12  loss (\d+\.\d{4})  lr (\d\.\d\de-\d\d)  "
                       r"([\d,]+) tokens/s  ETA (\d+s|\d+m \d\ds)")
EVAL_LINE = re.compile(r"step (\d+)/12  val loss (\d+\.\d{4}) \(perplexity \d+\.\d\d, "
                       r"\d+\.\d{4} bits/byte\), (a new best|best \d+\.\d{4} at step \d+ "
                       r"\(\d+ evaluations? without a new best\))")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _run(tmp_path, tiny_config, tiny_trainer, progress, stream, **train):
    trainer = tiny_trainer(tiny_config(log_interval=5, **train), tmp_path / "run")
    trainer.progress, trainer.progress_stream = progress, stream
    return trainer.run()


def test_without_a_terminal_a_line_every_log_interval_and_one_per_evaluation(
        tmp_path, tiny_config, tiny_trainer, read_metrics):
    stream = io.StringIO()  # not a terminal: "auto" (the default) writes lines
    _run(tmp_path, tiny_config, tiny_trainer, True, stream)
    lines = stream.getvalue().splitlines()
    rows = {r["step"]: r for r in read_metrics(tmp_path / "run")}
    kinds = [("eval" if EVAL_LINE.fullmatch(x) else "step" if STEP_LINE.fullmatch(x) else x)
             for x in lines]
    steps = [int(x.split()[1].split("/")[0]) for x in lines]
    # log_interval 5 and the last step; an evaluation every 4 steps and at the end
    assert list(zip(kinds, steps)) == [("eval", 4), ("step", 5), ("eval", 8), ("step", 10),
                                       ("step", 12), ("eval", 12)]
    for line in lines:
        if m := STEP_LINE.fullmatch(line):  # the very figures metrics.jsonl holds
            row = rows[int(m[1])]
            assert (m[2], m[3]) == (f"{row['loss']:.4f}", f"{row['lr']:.2e}")
            assert m[4] == f"{row['tokens_per_sec']:,.0f}"
        else:
            m = EVAL_LINE.fullmatch(line)
            assert m[2] == f"{rows[int(m[1])]['val_loss']:.4f}"
    assert lines[-2].endswith("ETA 0s")  # the last step


def test_a_terminal_gets_the_bar_and_the_evaluations_above_it(tmp_path, tiny_config,
                                                              tiny_trainer):
    stream = Terminal()
    _run(tmp_path, tiny_config, tiny_trainer, True, stream)
    text = stream.getvalue()
    assert "\r" in text and "train: 100%" in text and "12/12" in text
    assert not STEP_LINE.search(text)  # no plain step lines under a bar
    assert len(EVAL_LINE.findall(text)) == 3


@pytest.mark.parametrize("progress", [False, "off"])
def test_off_is_silent(tmp_path, tiny_config, tiny_trainer, progress):
    stream = Terminal()
    _run(tmp_path, tiny_config, tiny_trainer, progress, stream)
    assert stream.getvalue() == ""


def test_lines_even_on_a_terminal_when_asked(tmp_path, tiny_config, tiny_trainer):
    stream = Terminal()
    _run(tmp_path, tiny_config, tiny_trainer, "lines", stream, steps=5)
    assert [x.split("  ")[0] for x in stream.getvalue().splitlines()] == \
        ["step 4/5", "step 5/5", "step 5/5"]


def test_modes_eta_and_the_words():
    assert resolve_mode(True, Terminal()) == "bar"
    assert resolve_mode("auto", io.StringIO()) == "lines"
    assert resolve_mode(False, Terminal()) == "off"
    with pytest.raises(ValueError):
        resolve_mode("loud", io.StringIO())
    p = Progress("off", steps=100, start=20, log_interval=10)
    assert p.eta(30, elapsed=5.0) == pytest.approx(35.0)  # 70 steps at 0.5 s/step
    p.max_seconds = 20.0
    assert p.eta(30, elapsed=5.0) == pytest.approx(15.0)  # max_minutes comes first
    assert [duration(s) for s in (0, 44.6, 60, 312, 3599, 7530)] == \
        ["0s", "45s", "1m 00s", "5m 12s", "59m 59s", "2h 05m"]
    assert [plural(n, "file") for n in (0, 1, 2, 1234)] == \
        ["0 files", "1 file", "2 files", "1,234 files"]
    assert plural(1, "key/value head") == "1 key/value head"


def test_an_interrupted_run_before_its_first_evaluation_says_so(
        tmp_path, tiny_config, tiny_trainer, interrupt_after):
    trainer = tiny_trainer(tiny_config(), tmp_path / "run")
    interrupt_after(trainer, 2)  # the first evaluation is at step 4
    lines = trainer.run().lines()
    assert lines[0].startswith("interrupted at step 2 in ")
    assert lines[1].endswith(", no val loss yet (stopped before this session's first "
                             "evaluation)")
    assert not any("best" in line for line in lines)


def test_no_validation_split_is_said_only_when_there_is_none(tmp_path, tiny_config,
                                                             tiny_trainer):
    trainer = tiny_trainer(tiny_config(steps=2), tmp_path / "run")
    trainer.eval_x = trainer.eval_y = None  # as a dataset without a val split
    lines = trainer.run().lines()
    assert lines[1].endswith(", no validation split") and lines[0].startswith("finished")
    assert not (tmp_path / "run" / "best").exists()
