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

Every pool gets the count, whichever command runs (generate, chat, serve, eval: `cli.main`;
train, finetune: `train.start`, from train.threads):

- libraries already loaded: torch's intra-op pool and its MKL (`torch.set_num_threads`), its
  inter-op pool (`torch.set_num_interop_threads`, which torch allows only before the pool's
  first use), and every BLAS and OpenMP runtime threadpoolctl finds (OpenBLAS or MKL under
  NumPy, libgomp under torch), a BLAS at most the CPUs of the affinity mask (OpenBLAS's own
  limit when it loads, `taskset -c 0` leaving one);
- libraries loaded later: OMP_NUM_THREADS, OPENBLAS_NUM_THREADS and MKL_NUM_THREADS, which each
  reads when it loads (torch's at::init_num_threads and libgomp read OMP_NUM_THREADS, OpenBLAS
  prefers OPENBLAS_NUM_THREADS over it, so a value inherited from the shell cannot win); child
  processes inherit them too. A module that imports torch after `apply` calls `apply_to_torch()`
  for the inter-op pool, which reads no environment variable.

torch is never imported here (~2 s): the NumPy engine starts without it.
"""

from __future__ import annotations

import argparse
import os
import sys

AUTO = 0  # `--threads 0` / `--threads auto` / train.threads = 0: the default below
_ENV = "OMP_NUM_THREADS"
# What the thread pools loaded after `apply` read when they start (OpenBLAS prefers its own).
_POOL_ENV = (_ENV, "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
_applied: int | None = None  # the count `apply` set last, for torch loaded after it


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
    """Set every thread pool to `threads` (AUTO: the default less `spare`): torch's intra-op
    and inter-op pools if torch is loaded, every BLAS and OpenMP runtime loaded, and the
    environment the ones loaded later read (module docstring); returns the count set."""
    global _applied
    n = resolve(threads, spare)
    for name in _POOL_ENV:  # read by libraries when they load, and by child processes
        os.environ[name] = str(n)
    _applied = n
    apply_to_torch()
    from threadpoolctl import threadpool_limits
    # A BLAS gets no more threads than the CPUs this process may run on: OpenBLAS loaded later
    # caps itself so when it reads OPENBLAS_NUM_THREADS, and one loaded already is held to the
    # same rule, so the count never depends on which loaded first.
    threadpool_limits(limits={"blas": min(n, available_cores()), "openmp": n})
    return n


def applied() -> int | None:
    """The count `apply` set last, or None before any (no lookup: a hot path may ask)."""
    return _applied


def current() -> int:
    """The count the arithmetic runs on: the one `apply` set, else what `auto` would give."""
    return _applied if _applied is not None else resolve(AUTO)


def apply_to_torch() -> None:
    """Give torch, if loaded, the count `apply` set: its intra-op pool (and MKL's) and its
    inter-op pool. torch refuses a new inter-op size once that pool has run something (a
    RuntimeError): it then keeps the size it started with, which only `torch.jit.fork` and
    similar use (no path of sheepop's)."""
    torch = sys.modules.get("torch")
    if _applied is None or torch is None or not hasattr(torch, "set_num_threads"):
        return
    if torch.get_num_threads() != _applied:
        torch.set_num_threads(_applied)
    if torch.get_num_interop_threads() != _applied:
        try:
            torch.set_num_interop_threads(_applied)
        except RuntimeError:  # the inter-op pool already started
            pass


def describe() -> dict[str, int]:
    """{"torch": its intra-op threads, "torch interop": its inter-op threads (if torch is
    loaded), "<library>": threads, for every BLAS and OpenMP library loaded (threadpoolctl's
    internal_api: openblas, mkl, openmp...)}: what runs."""
    from threadpoolctl import threadpool_info
    out = {lib["internal_api"]: lib["num_threads"] for lib in threadpool_info()}
    torch = sys.modules.get("torch")
    if torch is not None:
        out["torch"] = torch.get_num_threads()
        out["torch interop"] = torch.get_num_interop_threads()
    return out


def blas_kernels() -> list[str]:
    """The BLAS libraries loaded and the kernels they run: 'openblas 0.3.31 (Haswell, 2
    threads)' (threadpoolctl's architecture: the CPU kernel set the library chose)."""
    from threadpoolctl import threadpool_info
    return [f"{lib['internal_api']} {lib.get('version') or ''} "
            f"({lib.get('architecture') or 'kernel unknown'}, {lib['num_threads']} threads)"
            for lib in threadpool_info() if lib["user_api"] == "blas"]
