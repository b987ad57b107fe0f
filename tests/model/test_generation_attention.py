"""Which attention kernels a generation step may use (sheepop.model.lm.generation_attention):
on CUDA every kernel but cuDNN's, whose per-shape plans made bf16 decoding on an H200 ~10x
slower over new cache lengths; nothing changes on the CPU. (The flags are torch's global
switches, so this runs without a GPU.)"""

from __future__ import annotations

import torch

from sheepop.model.lm import generation_attention


def switches() -> tuple[bool, bool, bool, bool]:
    b = torch.backends.cuda
    return (b.cudnn_sdp_enabled(), b.flash_sdp_enabled(), b.mem_efficient_sdp_enabled(),
            b.math_sdp_enabled())


def test_cuda_generation_leaves_out_cudnn_attention_and_restores_the_switches():
    before = switches()
    with generation_attention(torch.device("cuda")):
        assert switches() == (False, True, True, True)
    assert switches() == before


def test_cpu_generation_changes_nothing():
    before = switches()
    with generation_attention(torch.device("cpu")):
        assert switches() == before
