"""torch.compile, in one place, with inductor's on-disk cache kept apart per CPU capability.

Inductor's FX-graph cache is keyed by the graph, the inputs' shapes and inductor's config, but
not by ATEN_CPU_CAPABILITY, the variable that makes torch's CPU kernels (and inductor's own
choice of vector ISA) AVX2's on an AVX-512 machine. A graph compiled without it and loaded from
the cache with `ATEN_CPU_CAPABILITY=avx2` computed garbage on a Xeon with AVX-512 and torch
2.13 (a 4x64 @ 64x96 product, SiLU and a sum: a difference of 174 from eager; the compiled
decode step's logits were NaN), and right when compiled afresh. So when the variable is set and
the user has not chosen a cache (TORCHINDUCTOR_CACHE_DIR), the cache is a folder of its own
under inductor's default one, `capability-avx2`: each capability finds only its own graphs.
"""

from __future__ import annotations

import os
from collections.abc import Callable, MutableMapping

import torch

CAPABILITY_ENV = "ATEN_CPU_CAPABILITY"
CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


def cache_by_capability(environ: MutableMapping[str, str] = os.environ) -> str | None:
    """Point inductor's cache at `<default>/capability-<value>` when ATEN_CPU_CAPABILITY is set
    and no cache folder is; returns the folder set (None: nothing to set, or the user's own).
    Inductor reads TORCHINDUCTOR_CACHE_DIR at every use, so this holds for compilations after
    it; a process's capability is fixed when torch loads, so once is enough."""
    capability = environ.get(CAPABILITY_ENV, "").strip().lower()
    if not capability or environ.get(CACHE_ENV):
        return None
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    environ[CACHE_ENV] = os.path.join(default_cache_dir(), f"capability-{capability}")
    return environ[CACHE_ENV]


def compile(fn: Callable, **kwargs) -> Callable:  # noqa: A001 (torch.compile's name and role)
    """torch.compile(fn, **kwargs) on the capability's own cache (module docstring)."""
    cache_by_capability()
    return torch.compile(fn, **kwargs)
