"""How many threads the arithmetic runs on: torch's intra-op pool and the BLAS library under NumPy
(the NumPy engine's matrix products), set in one place for every command (`--threads N`,
`train.threads`).

The default (`auto`, 0) is the cores nobody else is using when the command starts:

    auto = min(cores, max(1, cores - round(load)))

with `load` the 1-minute load average (os.getloadavg) and `cores` the CPUs this process may run
on (os.sched_getaffinity). Threads of one product wait for each other at every step, so a
thread that shares its core with another busy process holds up the whole product: on a busy
2-core machine 2 threads were 3-12x slower than 1 (torch and OpenBLAS alike), while on a quiet one
2 threads gain ~25-60% (docs/performance.md, "Threads"; benchmarks/threads.py measures it).
An OMP_NUM_THREADS in the environment (`sheepop train --nproc` sets cores // N per process) is
taken as the default instead.

torch is never imported here: if it is not loaded yet, OMP_NUM_THREADS (read by its OpenMP
runtime when it loads) carries the count to it; if it is, torch.set_num_threads sets it. The
BLAS libraries already loaded (OpenBLAS or MKL under NumPy) get it through threadpoolctl.
"""

from __future__ import annotations

import argparse
import os
import sys

AUTO = 0  # `--threads 0` / `--threads auto` / train.threads = 0: the default below
_ENV = "OMP_NUM_THREADS"


def parse_threads(text: str) -> int:
    """`--threads`'s type: a count >= 1, or `auto` / 0 for the default (argparse reports its
    ArgumentTypeError as one line and exit status 2)."""
    if text.strip().lower() == "auto":
        return AUTO
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of threads or 'auto', not {text!r}"
                                         ) from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"the number of threads must be >= 0 (0: auto), "
                                         f"not {value}")
    return value


def available_cores() -> int:
    """The CPUs this process may run on (its affinity mask: a container's or taskset's limit)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not on Linux
        return max(1, os.cpu_count() or 1)


def load_average() -> float:
    """The 1-minute load average: the processes running or waiting for a CPU, averaged."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # not available (Windows)
        return 0.0


def default_threads(cores: int | None = None, load: float | None = None,
                    environ: dict[str, str] | None = None) -> int:
    """The count `auto` stands for: OMP_NUM_THREADS if the environment sets one, else the idle
    cores, min(cores, max(1, cores - round(load)))."""
    environ = os.environ if environ is None else environ
    given = environ.get(_ENV, "").strip()
    if given.isdigit() and int(given) > 0:
        return int(given)
    cores = available_cores() if cores is None else cores
    load = load_average() if load is None else load
    return min(cores, max(1, cores - round(load)))


def resolve(threads: int, spare: int = 0) -> int:
    """The count to use: `threads`, or when it is AUTO (0) the default less `spare` cores left
    to other work (at least 1)."""
    return threads if threads > 0 else max(1, default_threads() - spare)


def apply(threads: int = AUTO, spare: int = 0) -> int:
    """Set torch's intra-op threads and the loaded BLAS libraries' threads to `threads` (AUTO:
    the default less `spare`); returns the count set. torch is not imported: when it loads
    later it reads OMP_NUM_THREADS, set here."""
    n = resolve(threads, spare)
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "set_num_threads"):
        torch.set_num_threads(n)
    else:  # its OpenMP runtime reads it when torch loads (and so do processes started later)
        os.environ[_ENV] = str(n)
    from threadpoolctl import threadpool_limits
    threadpool_limits(limits=n, user_api="blas")
    return n


def describe() -> dict[str, int]:
    """{"torch": its intra-op threads (if loaded), "<blas library>": its threads}: what runs."""
    from threadpoolctl import threadpool_info
    out = {lib["internal_api"]: lib["num_threads"] for lib in threadpool_info()
           if lib["user_api"] == "blas"}
    torch = sys.modules.get("torch")
    if torch is not None:
        out["torch"] = torch.get_num_threads()
    return out
