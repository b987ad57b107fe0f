"""The explicit attention path (the one `/v1/inspect` uses: a hook reads its pattern) computes in
the input's precision: in float64 it agrees with the SDPA path to float64's rounding (issue 28;
it once rounded the scores to float32, 5.5e-7 relative), and in float32 as before."""

import pytest
import torch

from sheepop.arch.hooks import Hooks
from sheepop.config.schema import ModelConfig
from sheepop.model.attention import CausalSelfAttention


@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-13), (torch.float32, 1e-5)])
def test_the_explicit_path_agrees_with_sdpa_in_the_input_precision(dtype, tolerance):
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=10, block_size=32, n_layer=1, n_head=4, n_kv_head=2, n_embd=32)
    attn = CausalSelfAttention(cfg).to(dtype).eval()
    with torch.no_grad():
        for p in attn.parameters():
            p.copy_(torch.randn(p.shape, dtype=dtype))  # large scores: rounding shows
        x = torch.randn(2, 24, 32, dtype=dtype)
        fast = attn(x)
        seen = {}
        attn.hooks = Hooks(cfg, {"blocks.0.attn.pattern": lambda a, p: seen.update(a=a)}).blocks[0]
        explicit = attn(x)
    assert seen["a"].dtype == dtype
    relative = ((explicit - fast).abs().max() / fast.abs().max()).item()
    assert relative < tolerance, relative
