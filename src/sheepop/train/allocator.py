"""The C allocator of a training process, told to keep what a step frees (glibc only).

Every training step allocates the same tensors as the last one and frees them again. glibc's
malloc hands a large block back to the kernel when it is freed: blocks above its mmap threshold
(128 kB at first, raised as such blocks are freed, at most 32 MB) are unmapped, and free memory
at the top of the heap past its trim threshold is returned. The next step then touches fresh
pages, one page fault each: at the speedrun's BPE shape ~60,000 a step (240 MB), for sheepop's
recipe and nanoGPT's alike, 15% of the step's CPU time on this project's VM
(benchmarks/speedrun.py --step-parts, docs/speedrun.md). With both thresholds at 1 GiB the freed
blocks stay in the heap and the next step reuses them: ~0 faults. The process's resident memory
then stays at its peak between steps, which a training process reaches every step anyway.

Nothing changes what is computed. Elsewhere than glibc (macOS, musl) nothing is done.
"""

from __future__ import annotations

import ctypes
import ctypes.util

# mallopt's parameters (glibc's malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
KEEP = 1 << 30  # bytes: blocks below this stay in the heap, and so does this much free memory


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds to 1 GiB; False where there is no glibc."""
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError, TypeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, KEEP)) and bool(mallopt(M_TRIM_THRESHOLD, KEEP))
