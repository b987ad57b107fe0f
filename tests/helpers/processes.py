"""Real `python -m sheepop` processes for the tests that signal, race or lock them: started
unbuffered on one thread, waited on for a state the test can see (never a fixed sleep) within a
bound, their signal dispositions read from Linux's /proc."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pytest

BOUND_S = 120


def start_sheepop(args: Sequence[str], wrapper: Sequence[str] = (), new_session: bool = False,
                  program: Sequence[str] = (sys.executable, "-m", "sheepop"),
                  env: Mapping[str, str] | None = None) -> subprocess.Popen:
    """`[WRAPPER...] python -m sheepop ARGS` (or `program`, e.g. the installed script, in place
    of `python -m sheepop`) with its stdout and stderr piped as text; one OpenMP thread, output
    unbuffered (lines arrive as printed), `env` added to the environment; `new_session` gives it
    a process group of its own (for a terminal's Ctrl-C to the group)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.Popen([*wrapper, *program, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=new_session)


def wait_until(proc: subprocess.Popen, ready: Callable[[], bool], what: str,
               seconds: float = BOUND_S) -> None:
    """Poll `ready()` every 20 ms; fail the test with the process's output if it exits first,
    or kill it and fail when `seconds` pass."""
    deadline = time.monotonic() + seconds
    while not ready():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"exited ({proc.returncode}) before {what}: {out[-2000:]}{err[-2000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            proc.communicate()
            pytest.fail(f"no {what} within {seconds:g} s")
        time.sleep(0.02)


def _signal_mask(pid: int, field: str) -> int:
    """A signal bit mask of /proc/PID/status (bit signum - 1): SigCgt caught, SigIgn ignored."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1], 16)
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def catches(pid: int, signum: int) -> bool:
    """Whether process `pid` has a handler installed for `signum`."""
    return bool(_signal_mask(pid, "SigCgt") >> (signum - 1) & 1)


def ignores(pid: int, signum: int) -> bool:
    """Whether process `pid` ignores `signum` (SIG_IGN, as under nohup for SIGHUP)."""
    return bool(_signal_mask(pid, "SigIgn") >> (signum - 1) & 1)


def logged_steps(run: Path) -> list[int]:
    """The steps of the run's metrics.jsonl so far (a line still being written is skipped)."""
    path = run / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["step"] for line in path.read_text().splitlines()
            if line.endswith("}")]
