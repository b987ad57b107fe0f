"""model/compiler.py: inductor's cache kept apart per ATEN_CPU_CAPABILITY, whose FX-graph cache
key leaves the capability out (a graph compiled with AVX-512's kernels and loaded under
`ATEN_CPU_CAPABILITY=avx2` computed garbage)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from torch._inductor.runtime.cache_dir_utils import default_cache_dir

from sheepop.model.compiler import CACHE_ENV, cache_by_capability


def test_a_capability_gets_a_cache_folder_of_its_own():
    environ = {"ATEN_CPU_CAPABILITY": "AVX2"}
    assert cache_by_capability(environ) == os.path.join(default_cache_dir(), "capability-avx2")
    assert environ[CACHE_ENV] == os.path.join(default_cache_dir(), "capability-avx2")


def test_no_capability_or_the_users_own_cache_is_left_alone():
    assert cache_by_capability(environ := {}) is None and environ == {}
    environ = {"ATEN_CPU_CAPABILITY": "avx2", CACHE_ENV: "/mine"}
    assert cache_by_capability(environ) is None and environ[CACHE_ENV] == "/mine"


COMPILED_PRODUCT = """
import torch
from sheepop.model import compiler
torch.manual_seed(0)
x, w = torch.randn(4, 64), torch.randn(96, 64)
def f(x, w):
    return torch.nn.functional.silu(x @ w.t()).sum(-1)
got, want = compiler.compile(f)(x, w), f(x, w)
print(torch.backends.cpu.get_cpu_capability(), float((got - want).abs().max()))
"""


@pytest.mark.slow  # two cold compilations (~40 s in all): inductor's header and kernels
@pytest.mark.skipif(torch.backends.cpu.get_cpu_capability() in ("AVX2", "DEFAULT"),
                    reason="torch's CPU capability here is AVX2 or less already: both "
                           "compilations would run under the same one")
def test_a_graph_compiled_under_one_capability_is_not_reused_under_another(tmp_path):
    """The machine's own capability first (AVX-512 on some of our CPUs), then AVX2's, both on
    inductor's default cache (under TMPDIR): each compiled result equals eager's within float32's
    error on a sum of 96 SiLU(64-term dot products) of unit normals (|y| ~ 8 each: ~1e-3)."""
    env = {k: v for k, v in os.environ.items() if k not in (CACHE_ENV, "ATEN_CPU_CAPABILITY")}
    env["TMPDIR"] = str(tmp_path)
    for capability in ({}, {"ATEN_CPU_CAPABILITY": "avx2"}):
        out = subprocess.run([sys.executable, "-c", COMPILED_PRODUCT], env={**env, **capability},
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        name, difference = out.stdout.split()
        assert float(difference) < 1e-3, (name, difference)
