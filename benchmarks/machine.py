"""The machine a benchmark runs on, described the same way by every benchmark.

A figure means little without the machine that made it: machines of this kind differ (some have
AVX-512 with bf16 instructions, some AVX2 only: the kernels torch picks, its CPU capability),
NumPy's products run whichever kernel set the BLAS library chose for the CPU (threadpoolctl's
`architecture`), and the machines are shared, so the load average says how many cores the
benchmark really had. `summary()` is the line a benchmark prints at the start of its run,
`describe()` the same facts for its JSON.

torch and NumPy are imported when `describe` runs, not with this module: some benchmarks set
their threads before either loads (threads.py's measured processes, progression.py).
"""

from __future__ import annotations

import os
import platform
import time


def cpu_name() -> str:
    """The "model name" of /proc/cpuinfo, else what `platform` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe(**extra: object) -> dict:
    """The machine as JSON-ready values, then `extra` (a benchmark's own: threads, ...)."""
    import numpy as np
    import torch

    from sheepop import threads
    blas = threads.blas_kernels()
    usable = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
              else os.cpu_count())
    return {"cpu": cpu_name(), "cores": os.cpu_count(), "usable_cores": usable,
            "capability": torch.backends.cpu.get_cpu_capability(), "blas": blas,
            "torch": torch.__version__, "numpy": np.__version__,
            "python": platform.python_version(),
            "load_average": [round(x, 2) for x in os.getloadavg()],
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), **extra}


def summary(described: dict | None = None) -> str:
    """One line of `described` (default: `describe()` now): 'AMD EPYC, 2 cores (2 usable), AVX2,
    BLAS openblas 0.3.31 (Haswell, 1 threads), torch 2.13.0+cpu, numpy 2.4.6, Python 3.11.7,
    load average 0.97 0.80 0.70, 2026-11-26 10:20 UTC'."""
    m = describe() if described is None else described
    return (f"{m['cpu']}, {m['cores']} cores ({m['usable_cores']} usable), {m['capability']}, "
            f"BLAS {'; '.join(m['blas']) or 'none loaded'}, torch {m['torch']}, "
            f"numpy {m['numpy']}, Python {m['python']}, load average "
            f"{' '.join(f'{x:.2f}' for x in m['load_average'])}, {m['date']}")
