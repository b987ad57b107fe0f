"""Real signals sent to a real `sheepop train` process: SIGTERM and SIGHUP save the last step and
exit 128 + the signal (like Ctrl-C's 130), the run resumes on its recorded data; Ctrl-C during
start-up is one line and exit 130. Each waits for a state it can see, within bounded time."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest
from processes import BOUND_S, catches, logged_steps, start_sheepop, wait_until

from sheepop.cli import main

TINY = ["--no-progress", "--set", "model.n_layer=1", "--set", "model.n_head=2",
        "--set", "model.n_embd=16", "--set", "model.block_size=16", "--set", "train.batch_size=2",
        "--set", "train.log_interval=1", "--set", "train.eval_interval=0",
        "--set", "train.checkpoint_interval=0", "--set", "train.threads=1",
        "--set", "train.warmup_steps=2"]


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` (Linux: /proc/PID/stat fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.fixture
def text_file(tmp_path) -> Path:
    rng = np.random.default_rng(0)
    words = "the quick brown fox jumps over a lazy dog while seven sheep sleep".split()
    path = tmp_path / "my.txt"
    path.write_text(" ".join(rng.choice(words, 3000)))
    return path


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP],
                         ids=lambda s: signal.Signals(s).name)
def test_a_signal_saves_the_last_step_and_the_run_resumes_on_its_data(
        tmp_path, text_file, signum, capsys):
    run = tmp_path / "run"
    proc = start_sheepop(["train", str(text_file), "--out", str(run), "--steps", "100000", *TINY])
    wait_until(proc, lambda: len(logged_steps(run)) >= 3, "three logged steps")
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=BOUND_S)
    assert proc.returncode == 128 + signum, out + err
    step = json.loads((run / "trainer.json").read_text())["step"]
    name = signal.Signals(signum).name
    assert f"interrupted ({name}): saving a checkpoint of step {step}" in out
    assert f"interrupted at step {step} " in out
    assert "Traceback" not in err
    assert logged_steps(run) == list(range(1, step + 1))
    # --resume without DATA continues on the data the run recorded, not the built-in corpus.
    assert main(["train", "--resume", "--out", str(run), "--steps", str(step + 2), *TINY]) == 0
    assert f"resuming on the data the run recorded: {text_file}" in capsys.readouterr().out
    assert logged_steps(run) == list(range(1, step + 3))


def test_ctrl_c_during_start_up_is_one_line_and_exit_130(tmp_path):
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it) while the BPE
    tokenizer trains on 1 MB of text: sent once the process catches SIGTERM (so
    `sheepop.cli.main` runs) and has used 2 s of CPU (imports take well under 1 s; reading the
    text and training the tokenizer take about 20 s here, and nothing is printed before)."""
    rng = np.random.default_rng(0)
    letters = list("abcdefghijklmnopqrstuvwxyz")
    vocab = ["".join(rng.choice(letters, int(rng.integers(2, 9)))) for _ in range(3000)]
    data = tmp_path / "big.txt"
    data.write_text(" ".join(rng.choice(vocab, 170_000)))
    run = tmp_path / "run"
    proc = start_sheepop(["train", str(data), "--out", str(run), "--steps", "5", "--tokenizer",
                          "bpe", "--vocab-size", "2000", *TINY], new_session=True)
    wait_until(proc, lambda: catches(proc.pid, signal.SIGTERM)
               and _cpu_seconds(proc.pid) >= 2.0, "sheepop's start-up")
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=BOUND_S)
    assert proc.returncode == 130, out + err
    assert err.strip() == "sheepop: interrupted"
    assert "model:" not in out  # it stopped during start-up, before the model was built
    assert not (run / "trainer.json").exists()
