"""model.qk_norm: each head's queries and keys RMS-normalised before RoPE, in both engines (the
gradients are checked with the whole model in tests/scratch/test_scratch_model_grad.py, the
engines' equality in test_scratch_vs_torch.py). Here: the KV cache gives the full forward's
logits, the step-by-step trace gives the engines' logits and its scores stay within
+-sqrt(d_k), and the exports refuse it by name."""

from __future__ import annotations

import math

import numpy as np
import pytest
from kv_cache_check import assert_the_cache_gives_the_full_forward
from variants import gqa, llama

from sheepop.config.schema import ModelConfig
from sheepop.errors import UserError
from sheepop.interop.gpt2 import check_gpt2_shaped
from sheepop.interop.llama import check_llama_shaped
from sheepop.scratch import gpt_forward
from sheepop.scratch.init import init_params
from sheepop.scratch.token_steps import trace_token

CFG = ModelConfig(vocab_size=23, block_size=16, n_layer=2, n_embd=32, qk_norm=True,
                  **llama(**gqa(4, 2)))


def big_weights(cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Weights far from init, so unnormalised scores would be large."""
    params = init_params(cfg, 0)
    rng = np.random.default_rng(1)
    for v in params.values():
        v += (rng.standard_normal(v.shape) * (0.5 if v.ndim > 1 else 0.1)).astype(v.dtype)
    return params


def test_the_kv_cache_gives_the_full_forwards_logits_in_both_engines():
    x = np.random.default_rng(2).integers(0, CFG.vocab_size, (2, 12))
    assert_the_cache_gives_the_full_forward(big_weights(CFG), CFG, x)


@pytest.mark.parametrize("kw", [{}, {"pos_encoding": "learned", "norm": "layernorm",
                                     "ffn": "mlp", "bias": True}])
def test_the_trace_follows_it_and_its_scores_stay_within_root_dk(kw):
    cfg = ModelConfig(**{**CFG.__dict__, **kw})
    w = big_weights(cfg)
    ids = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]
    reference = gpt_forward(w, cfg, np.asarray([ids]))[0][0]
    for t, layer in ((0, 0), (6, 1), (9, 1)):
        x = trace_token(w, cfg, ids, t, layer)
        assert np.abs(x.logits - reference[t]).max() < 1e-4
        for head in x.heads:
            assert math.isclose(np.linalg.norm(head.q), math.sqrt(cfg.head_dim), rel_tol=1e-4)
            assert np.abs(head.raw[:t + 1]).max() <= math.sqrt(cfg.head_dim) * (1 + 1e-5)
    unnormalised = ModelConfig(**{**cfg.__dict__, "qk_norm": False})
    raw = trace_token(w, unnormalised, ids, 9, 1).heads[0].raw
    assert np.abs(raw).max() > math.sqrt(cfg.head_dim)  # (the weights would pass the bound)


def test_exports_refuse_it_by_name():
    with pytest.raises(UserError, match="model.qk_norm=true .Llama does not normalise"):
        check_llama_shaped(CFG)
    with pytest.raises(UserError, match="model.qk_norm=true .GPT-2 does not normalise"):
        check_gpt2_shaped(ModelConfig(pos_encoding="learned", activation="gelu_tanh",
                                      qk_norm=True))
