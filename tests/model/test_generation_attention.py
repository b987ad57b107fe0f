"""Which attention kernels a generation step may use (sheepop.model.lm.generation_attention):
on CUDA every kernel but cuDNN's, whose per-shape plans made bf16 decoding on an H200 ~10x
slower over new cache lengths; nothing changes on the CPU. (The flags are torch's global
switches, so this runs without a GPU.)"""

from __future__ import annotations

import numpy as np
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


def test_a_grouped_decode_step_attends_per_key_value_head_with_the_full_forwards_logits(
        monkeypatch):
    """A one-token step of grouped-query attention hands SDPA the H / H_kv queries of each
    key/value head as rows (B, H_kv, H / H_kv, d_k), no GQA expansion asked, and still gives
    the logits of a full forward pass over the whole sequence (no cache)."""
    from variants import llama

    from sheepop.config.schema import ModelConfig
    from sheepop.model import GPT
    from sheepop.model.lm import TorchLM

    cfg = ModelConfig(vocab_size=29, block_size=32, n_layer=2, n_embd=32, dropout=0.0,
                      **llama(n_head=4, n_kv_head=2))
    torch.manual_seed(0)
    model = GPT(cfg).double().eval()
    ids = [3, 1, 4, 1, 5, 9, 2, 6]
    with torch.no_grad():
        full = model(torch.tensor([ids]))[0][0]
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def recorded(q, k, v, **kw):
        calls.append((tuple(q.shape), tuple(k.shape), kw.get("enable_gqa", False)))
        return sdpa(q, k, v, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recorded)
    lm = TorchLM(model)
    lm.prefill(ids[:5])
    calls.clear()
    steps = [lm.decode(t) for t in ids[5:]]
    assert calls and all(q == (1, 2, 2, 8) and not gqa for q, _, gqa in calls)
    assert [k[2] for _, k, _ in calls] == [6, 6, 7, 7, 8, 8]  # every key so far, per layer
    for t, logits in zip(range(5, 8), steps):  # (logits come out in float32)
        np.testing.assert_allclose(logits, full[t].numpy(), rtol=0, atol=1e-6)
