"""sheepop.train.allocator: after keep_freed_memory, large blocks freed and allocated again, as
each training step allocates what the last one freed, reuse the same memory, their pages not
faulted in anew. Measured in a fresh process each way, by its minor page faults."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sheepop.train.allocator import keep_freed_memory

PROGRAM = """
import resource, sys, torch
from sheepop.train.allocator import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
def faults_of_a_step():  # a few blocks written, held together, then freed, as a step does
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    blocks = [torch.empty(n * 2**18).fill_(1.0) for n in (64, 16, 4, 64)]
    del blocks
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
faults_of_a_step()
print(min(faults_of_a_step() for _ in range(6)))  # (glibc's aligned blocks sometimes miss
                                                  # the hole a freed one left: one in a few)
"""


def step_faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", PROGRAM, mode], capture_output=True, text=True,
                         check=True)
    return int(out.stdout.split()[-1])


def test_a_freed_block_is_reused_without_faulting_its_pages_again():
    if not keep_freed_memory():
        pytest.skip("no glibc mallopt here")
    pages = 148 * 2**20 // 4096  # the four blocks' 148 MB
    assert step_faults("default") > pages // 2  # every step: glibc unmapped them, maps anew
    assert step_faults("keep") < pages // 100
