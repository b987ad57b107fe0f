"""Training on 2 processes (torchrun, gloo on CPU) against one process; resume; failing ranks.

Every run trains the same tiny model on the same text. Two processes with batch 2 each draw the
windows of one process with batch 4 (rank r keeps rows [2r, 2r+2) of each global micro-batch),
and the step's loss is normalised by the token count of all ranks, so their weights must agree
to float rounding. `data.sampling=chunks` pads the stream's last window: some micro-batches then
hold fewer counted targets on one rank than on the other, which an average of per-rank means
would get wrong.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from sheepop.cli import main
from sheepop.cli.launch import argv_from_args, torchrun_command
from sheepop.config.build import build_config
from sheepop.data.dataset import load_dataset
from sheepop.data.windows import IGNORE_INDEX, WindowSampler
from sheepop.train.distributed import RankSampler

HELPER = Path(__file__).with_name("rank_main.py")
WORDS = "the quick brown fox jumps over a lazy dog while seven sheep sleep".split()
BLOCK, STEPS, HALF = 16, 8, 4
# Long enough that ranks starting seconds apart on a loaded machine do not time out at start-up.
HANG_TIMEOUT_S = 8
SETTINGS = ["model.n_layer=1", "model.n_head=2", "model.n_embd=16", f"model.block_size={BLOCK}",
            "model.dropout=0", "train.grad_accum=2", "train.warmup_steps=2",
            f"train.decay_steps={STEPS}", "train.lr=3e-3", "train.eval_interval=4",
            "train.eval_batches=2", "train.log_interval=1", "train.checkpoint_interval=0",
            "data.sampling=chunks", "data.val_fraction=0.2"]


def options(batch: int, steps: int, *extra: str) -> list[str]:
    out = ["--steps", str(steps), "--no-progress", "--set", f"train.batch_size={batch}"]
    for item in (*SETTINGS, *extra):
        out += ["--set", item]
    return out


def torchrun(args: list[str], fault: str | None = None, timeout_s: float | None = None
             ) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("SHEEPOP_TEST_FAULT", None)
    if fault:
        env["SHEEPOP_TEST_FAULT"] = fault
    if timeout_s:
        env["SHEEPOP_DIST_TIMEOUT"] = str(timeout_s)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(HELPER), "train", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


def one_process(args: list[str]) -> None:
    threads = torch.get_num_threads()
    try:
        assert main(["train", *args, "--set", "train.threads=1"]) == 0
    finally:
        torch.set_num_threads(threads)


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def max_weight_diff(a: Path, b: Path) -> float:
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert wa.keys() == wb.keys()
    return max(float(np.abs(wa[k] - wb[k]).max()) for k in wa)


def check_ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """The runs the tests compare (each launched once for the whole module)."""
    root = tmp_path_factory.mktemp("dist")
    rng = np.random.default_rng(0)
    data = root / "text.txt"
    data.write_text(" ".join(rng.choice(WORDS, 89)))
    r = {"data": data}
    # One process, batch 4: the reference; and its first half, for a resume on 2 processes.
    r["one"], r["one_half"] = root / "one", root / "one_half"
    one_process([str(data), "--out", str(r["one"]), *options(4, STEPS)])
    one_process([str(data), "--out", str(r["one_half"]), *options(4, HALF)])
    # Two processes, batch 2 each, through the `--nproc` shortcut (which starts torchrun).
    r["two"] = root / "two"
    proc = subprocess.run([sys.executable, "-m", "sheepop", "train", str(data), "--out",
                           str(r["two"]), "--nproc", "2", *options(2, STEPS)],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    r["two_stdout"] = check_ok(proc)
    # With dropout: 8 steps straight, and 4 steps then a resume (exactness needs the RNG).
    drop = "model.dropout=0.2"
    r["drop"], r["drop_resumed"] = root / "drop", root / "drop_resumed"
    check_ok(torchrun([str(data), "--out", str(r["drop"]), *options(2, STEPS, drop)]))
    check_ok(torchrun([str(data), "--out", str(r["drop_resumed"]), *options(2, HALF, drop)]))
    check_ok(torchrun([str(data), "--out", str(r["drop_resumed"]), "--resume",
                       *options(2, STEPS, drop)]))
    # FSDP resumes the one-process checkpoint (full state -> shards -> full state).
    r["fsdp"] = root / "fsdp"
    shutil.copytree(r["one_half"], r["fsdp"])
    check_ok(torchrun([str(data), "--out", str(r["fsdp"]), "--resume",
                       *options(2, STEPS, "train.fsdp=true")]))
    return r


def test_the_data_exercises_uneven_token_counts(runs):
    """Replays the sampler: some micro-batch must have padding in one rank's half only."""
    cfg = build_config("tiny", None, [f"{k}" for k in SETTINGS])
    data = load_dataset(str(runs["data"]), cfg.data)
    pad = data.tokenizer.pad_id or 0
    sampler = WindowSampler(data.train, BLOCK, 4, cfg.train.seed, "chunks", 0, pad)
    counts = [[int((y[h:h + 2] != IGNORE_INDEX).sum()) for h in (0, 2)]
              for _ in range(STEPS * 2) for y in [sampler.next_batch()[1]]]
    assert any(a != b for a, b in counts), counts


def test_two_processes_equal_one_process_with_the_same_global_batch(runs):
    assert max_weight_diff(runs["two"], runs["one"]) < 1e-5
    two, one = metrics(runs["two"]), metrics(runs["one"])
    assert [m["step"] for m in two] == list(range(1, STEPS + 1))  # rank 0 alone wrote
    for a, b in zip(two, one):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], abs=1e-5)
    out = runs["two_stdout"]
    assert out.count(f"finished step {STEPS}") == 1
    assert ("data parallel: 2 processes x batch 2 x 2 micro-batches = 8 sequences "
            f"({8 * BLOCK} tokens) per step") in out
    assert "DDP over 2 processes (gloo)" in out


def test_a_resumed_two_process_run_continues_exactly(runs):
    straight, resumed = metrics(runs["drop"]), metrics(runs["drop_resumed"])
    assert [m["step"] for m in resumed] == list(range(1, STEPS + 1))
    for a, b in zip(straight, resumed):
        assert {k: v for k, v in a.items() if k != "tokens_per_sec"} == \
               {k: v for k, v in b.items() if k != "tokens_per_sec"}
    assert max_weight_diff(runs["drop"], runs["drop_resumed"]) == 0.0


def test_a_two_process_checkpoint_resumes_on_one_process(runs, tmp_path):
    """Two more steps on one process (batch 4) from the 2-process run's checkpoint and from the
    1-process run's: the same continuation (its data position, moments and step carry over)."""
    for name in ("two", "one"):
        shutil.copytree(runs[name], tmp_path / name)
        one_process([str(runs["data"]), "--out", str(tmp_path / name), "--resume",
                     *options(4, STEPS + 2)])
    assert max_weight_diff(tmp_path / "two", tmp_path / "one") < 1e-5
    from_two, from_one = metrics(tmp_path / "two"), metrics(tmp_path / "one")
    assert [m["step"] for m in from_two] == list(range(1, STEPS + 3))
    for a, b in zip(from_two[STEPS:], from_one[STEPS:]):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)


def test_fsdp_continues_a_one_process_checkpoint_as_one_process_would(runs):
    assert max_weight_diff(runs["fsdp"], runs["one"]) < 1e-5
    for a, b in zip(metrics(runs["fsdp"]), metrics(runs["one"])):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)


@pytest.mark.parametrize("kind", ["crash", "hang"])
def test_a_failing_rank_stops_the_job_with_a_clear_error(runs, tmp_path, kind):
    start = time.perf_counter()
    proc = torchrun([str(runs["data"]), "--out", str(tmp_path / "run"), *options(2, STEPS)],
                    fault=f"{kind}:1:3", timeout_s=HANG_TIMEOUT_S)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    if kind == "hang":  # rank 0's collective times out: one line says what happened
        assert ("sheepop: error: rank 0 of 2: step 3 failed: another rank did not answer "
                f"within {HANG_TIMEOUT_S} s (SHEEPOP_DIST_TIMEOUT); stopping.") in out
    else:  # torchrun names the rank that died; rank 0 is stopped instead of waiting
        assert "Signal 9 (SIGKILL) received by PID" in out
    assert time.perf_counter() - start < 120
    assert [m["step"] for m in metrics(tmp_path / "run")] == [1, 2]


def test_sigterm_stops_every_rank_at_one_step_which_is_saved(runs, tmp_path):
    """SIGTERM to `sheepop train --nproc 2` alone (as `docker stop` or systemd send it): the
    launcher passes it to torchrun, which sends it to both ranks; they agree on one step
    boundary, rank 0 saves it, both exit cleanly (no rank killed), and the run resumes."""
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "sheepop", "train", str(runs["data"]), "--out",
                             str(run), "--nproc", "2", *options(2, 100_000)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.monotonic() + 120
    while not ((run / "metrics.jsonl").exists() and len(metrics(run)) >= 3):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, out[-3000:] + err[-3000:]
    step = json.loads((run / "trainer.json").read_text())["step"]
    assert f"interrupted (SIGTERM): saving a checkpoint of step {step}" in out
    assert out.count(f"interrupted at step {step} ") == 1  # rank 0's summary
    assert [m["step"] for m in metrics(run)] == list(range(1, step + 1))
    assert "Traceback" not in out and "[rank0]" not in err and "[rank1]" not in err
    assert "SIGKILL" not in err and "SIGABRT" not in err
    check_ok(torchrun([str(runs["data"]), "--out", str(run), "--resume", *options(2, step + 2)]))
    assert [m["step"] for m in metrics(run)] == list(range(1, step + 3))


def test_nproc_relaunches_the_same_arguments_under_torchrun():
    from sheepop.cli import build_parser
    argv = ["train", "data dir", "--out", "r", "--steps", "5", "--resume", "--nproc", "3",
            "--set", "train.lr=1e-3", "--set", "model.n_layer=2"]
    args = build_parser().parse_args(argv)
    again = argv_from_args(args.train_parser, args, ("nproc",))
    assert again == ["data dir", "--out", "r", "--steps", "5", "--resume",
                     "--set", "train.lr=1e-3", "--set", "model.n_layer=2"]
    cmd = torchrun_command(3, ["train", *again])
    assert cmd[1:6] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=3",
                        "-m"]
    assert cmd[6:8] == ["sheepop", "train"]


def test_rank_sampler_takes_its_rows_of_the_global_batch():
    tokens = np.arange(500, dtype=np.uint16)
    whole = WindowSampler(tokens, 8, 6, 7)
    parts = [RankSampler(WindowSampler(tokens, 8, 2, 7), r, 3) for r in range(3)]
    for _ in range(3):
        x, y = whole.next_batch()
        got = [p.next_batch() for p in parts]
        np.testing.assert_array_equal(np.concatenate([g[0] for g in got]), x)
        np.testing.assert_array_equal(np.concatenate([g[1] for g in got]), y)
    assert parts[1].state() == whole.state()
