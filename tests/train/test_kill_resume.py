"""Randomized kill -9 during training with a checkpoint every step, then --resume: a few trials
of benchmarks/kill_resume.py (which runs hundreds and prints the counts for docs/)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "kill_resume.py"


def test_a_run_killed_at_random_moments_always_resumes_from_its_last_checkpoint():
    done = subprocess.run([sys.executable, str(SCRIPT), "--trials", "2", "--seed", "13",
                           "--max-delay", "0.5"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "resumed 2 of 2; refused 0" in done.stdout, done.stdout
