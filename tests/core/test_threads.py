"""sheepop.threads and `--threads`: the default from the cores and the load, the one option on
every command that computes, and the count reaching torch and the BLAS under NumPy."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest

from sheepop.cli import build_parser, main
from sheepop.cli.common import APPLY_THREADS, CONFIG_FLAGS
from sheepop.threads import default_threads, parse_threads


@pytest.mark.parametrize(("cores", "load", "expected"), [
    (2, 0.1, 2), (2, 0.6, 1), (2, 1.4, 1), (2, 6.8, 1),   # round(0.6) = 1 core busy
    (16, 3.4, 13), (16, 0.0, 16), (1, 0.0, 1), (4, 2.5, 2),
])
def test_auto_is_the_cores_the_load_leaves_idle(cores, load, expected):
    assert default_threads(cores, load, environ={}) == expected


def test_auto_takes_omp_num_threads_when_the_environment_sets_it():
    assert default_threads(16, 0.0, environ={"OMP_NUM_THREADS": "3"}) == 3
    assert default_threads(16, 0.0, environ={"OMP_NUM_THREADS": "x"}) == 16  # not a count
    assert default_threads(16, 0.0, environ={"OMP_NUM_THREADS": "0"}) == 16


def test_parse_threads_takes_a_count_or_auto():
    assert [parse_threads(t) for t in ("auto", "AUTO", "0", "1", "12")] == [0, 0, 0, 1, 12]
    for bad in ("-1", "two", "1.5", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_threads(bad)


# Every command that computes, with the arguments it needs to parse; True: a training command,
# whose --threads sets train.threads; False: applied by cli.main before the command runs.
COMMANDS = {
    ("train",): True, ("finetune", "RUN"): True, ("progression", "train", "D", "--out", "O"): True,
    ("generate", "RUN"): False, ("chat", "RUN"): False, ("eval", "RUN", "--data", "D"): False,
    ("serve", "RUN"): False, ("progression", "eval", "RUN", "--data", "D"): False,
}


@pytest.mark.parametrize("argv", list(COMMANDS), ids=" ".join)
def test_every_command_that_computes_has_the_one_threads_option(argv):
    parser = build_parser()
    args = parser.parse_args([*argv, "--threads", "3"])
    assert args.threads == 3
    if COMMANDS[argv]:
        assert getattr(args, CONFIG_FLAGS)["threads"] == "train.threads"
        assert parser.parse_args(list(argv)).threads is None  # not given: the config decides
    else:
        assert getattr(args, APPLY_THREADS) is True
        assert parser.parse_args([*argv, "--threads", "auto"]).threads == 0
        assert parser.parse_args(list(argv)).threads == 0  # not given: auto


@pytest.mark.parametrize("value", ["-2", "many"])
def test_a_bad_thread_count_is_one_line_and_exit_2(value, capsys):
    with pytest.raises(SystemExit) as e:
        main(["generate", "RUN", "--threads", value])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("sheepop generate: error: argument --threads: ")
    assert "Traceback" not in "".join(err)


def _threads_in_child(code: str) -> dict[str, int]:
    """Run `code` in a fresh Python, then print what sheepop.threads.describe() reports: torch's
    pools and every BLAS and OpenMP library threadpoolctl finds loaded."""
    tail = ("\nimport numpy, torch\nfrom sheepop.threads import describe\nimport json\n"
            "print(json.dumps(describe()))")
    env = {k: v for k, v in os.environ.items()  # the count set here, not one inherited
           if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", code + tail], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _pools(found: dict[str, int]) -> dict[str, int]:
    """The libraries found, checked to include torch, a BLAS and an OpenMP runtime."""
    assert {"torch", "torch interop", "openmp"} <= set(found), found
    assert set(found) & {"openblas", "mkl", "blis", "flexiblas"}, found
    return found


def _expected(found: dict[str, int], n: int) -> dict[str, int]:
    """n in every pool, but a BLAS never past the CPUs this process may run on: OpenBLAS sizes
    its pool when it loads from the affinity mask (`taskset -c 0` leaves one) and keeps within
    it, so a machine pinned to fewer cores than n reports that many."""
    cpus = len(os.sched_getaffinity(0))
    return {pool: min(n, cpus) if pool in ("openblas", "mkl", "blis", "flexiblas") else n
            for pool in found}


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("torch_first", [False, True])
def test_apply_sets_every_pool_whether_torch_is_loaded_or_not(torch_first, n):
    code = ("import numpy\n" + ("import torch\n" if torch_first else "")
            + f"from sheepop import threads\nassert threads.apply({n}) == {n}\n"
            + ("" if torch_first else "import torch\nthreads.apply_to_torch()"))
    found = _pools(_threads_in_child(code))
    assert found == _expected(found, n)


def test_the_training_engine_is_built_with_train_threads():
    code = ("from sheepop.config.build import build_config\n"
            "from sheepop.train.start import make_engine\n"
            "cfg = build_config('tiny', None, ['train.threads=1', 'model.n_layer=1', "
            "'model.vocab_size=32'])\n"
            "make_engine(cfg)")
    found = _pools(_threads_in_child(code))
    assert set(found.values()) == {1}, found


@pytest.mark.parametrize("numpy_first", [False, True])
def test_a_blas_gets_no_more_threads_than_the_cpus_it_may_run_on(numpy_first):
    """Pinned to one CPU and asked for 2: torch and OpenMP get 2, the BLAS 1, whether it loaded
    before `apply` (held to it by threadpoolctl) or after (OpenBLAS's own cap at load)."""
    code = ("import os\nos.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
            + ("import numpy\n" if numpy_first else "")
            + "from sheepop import threads\nassert threads.apply(2) == 2\n"
            "import numpy, torch\nthreads.apply_to_torch()")
    found = _pools(_threads_in_child(code))
    blas = {pool: k for pool, k in found.items() if pool in ("openblas", "mkl", "blis")}
    assert set(blas.values()) == {1}, found
    assert {found["torch"], found["torch interop"], found["openmp"]} == {2}, found


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    from sheepop.checkpoint import format as checkpoint
    from sheepop.config.schema import Config
    from sheepop.model import GPT
    from sheepop.tokenizers import train_tokenizer
    run = tmp_path_factory.mktemp("run")
    tokenizer = train_tokenizer("char", ["abc abc"], 0)
    cfg = Config()
    cfg.model.vocab_size, cfg.model.n_layer, cfg.model.n_head = tokenizer.vocab_size, 1, 2
    cfg.model.n_embd, cfg.model.block_size = 16, 16
    checkpoint.save_checkpoint(run, GPT(cfg.model).numpy_weights(), cfg.to_dict(),
                               tokenizer.to_json())
    (run / "text.txt").write_text("abc abc " * 20)
    return run


@pytest.mark.parametrize(("command", "n"), [
    ("generate torch", 1), ("generate torch", 2), ("generate numpy", 1), ("generate numpy", 2),
    ("eval", 1), ("eval", 2),
])
def test_the_commands_threads_reach_every_pool(tiny_run, command, n):
    """Through the command line: the count of --threads in torch's intra-op and inter-op pools,
    OpenBLAS's and libgomp's (whichever engine ran, and torch loaded before or after)."""
    argv = {"generate torch": ["generate", str(tiny_run), "--prompt", "ab", "--max-new-tokens",
                               "2", "--engine", "torch", "--device", "cpu"],
            "generate numpy": ["generate", str(tiny_run), "--prompt", "ab", "--max-new-tokens",
                               "2", "--engine", "numpy"],
            "eval": ["eval", str(tiny_run), "--data", str(tiny_run / "text.txt"),
                     "--engine", "torch"]}[command]
    code = ("from sheepop.cli import main\n"
            f"assert main({[*argv, '--threads', str(n)]!r}) == 0\n"
            # the NumPy engine never loads torch: when it does later, apply_to_torch sizes it
            + ("import torch\nfrom sheepop.threads import apply_to_torch\napply_to_torch()"
               if "numpy" in command else ""))
    found = _pools(_threads_in_child(code))
    assert found == _expected(found, n)
