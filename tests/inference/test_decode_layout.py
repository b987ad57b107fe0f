"""The decode layout (sheepop.arch.layout): each engine stores every weight matrix in the order
the rule names, and the model computes what it computed in the usual layout."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from variants import llama

from sheepop.arch.layout import column_major
from sheepop.config.schema import ModelConfig
from sheepop.model.gpt import GPT
from sheepop.model.lm import TorchLM
from sheepop.scratch.init import init_params
from sheepop.scratch.lm import NumpyLM

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]


@pytest.fixture
def cfg() -> ModelConfig:
    # tied head (the token table is a product's matrix too), SwiGLU 32 -> 48 -> 32: the gate
    # and up projections taller than wide, the down projection wider than tall
    return ModelConfig(vocab_size=41, block_size=32, n_layer=2, n_embd=32, d_ff=48,
                       dropout=0.0, **llama(n_head=4, n_kv_head=2, tie_weights=True))


def test_the_rule_by_shape():
    assert column_major((1536, 576)) and column_major((49152, 576)) and column_major((576, 576))
    assert not column_major((576, 1536)) and not column_major((576,))


def greedy(lm, n: int = 12) -> list[int]:
    token, out = int(np.argmax(lm.prefill(PROMPT))), []
    for _ in range(n):
        out.append(token)
        token = int(np.argmax(lm.decode(token)))
    return out


def test_numpy_engine_stores_each_matrix_by_the_rule(cfg):
    weights = init_params(cfg, seed=3)
    fast, plain = NumpyLM(cfg, weights), NumpyLM(cfg, weights, decode_layout=False)
    orders = {}
    for name, w in fast.params.items():
        assert np.array_equal(w, weights[name]), name
        if w.ndim == 2:
            orders[name] = "F" if column_major(w.shape) else "C"
            assert w.flags.f_contiguous if orders[name] == "F" else w.flags.c_contiguous, name
            assert plain.params[name].flags.c_contiguous
    assert orders["tok_emb.weight"] == "F" and orders["blocks.0.ffn.gate.weight"] == "F"
    assert orders["blocks.0.ffn.proj.weight"] == "C"
    assert np.allclose(fast.prefill(PROMPT), plain.prefill(PROMPT), atol=1e-5, rtol=0)
    assert greedy(fast) == greedy(plain)


def test_torch_engine_stores_each_matrix_by_the_rule(cfg):
    torch.manual_seed(4)
    plain = TorchLM(GPT(cfg), decode_layout=False)
    model = GPT(cfg)
    model.load_state_dict(plain.model.state_dict())
    fast = TorchLM(model)
    params = dict(fast.model.named_parameters())
    for name, p in params.items():
        if p.dim() == 2:
            assert (p.t().is_contiguous() if column_major(p.shape) else p.is_contiguous()), name
    assert params["tok_emb.weight"].t().is_contiguous()
    assert params["blocks.0.ffn.proj.weight"].is_contiguous()
    assert all(p.is_contiguous() for p in plain.model.parameters())
    for name, value in plain.model.numpy_weights().items():
        assert np.array_equal(fast.model.numpy_weights()[name], value), name
    assert np.allclose(fast.prefill(PROMPT), plain.prefill(PROMPT), atol=1e-5, rtol=0)
    assert greedy(fast) == greedy(plain)
    fast.cast(torch.bfloat16)  # bfloat16 products run fastest on the usual layout
    assert all(p.is_contiguous() for p in fast.model.parameters())


def test_weights_in_the_decode_layout_are_written_as_they_read(cfg, tmp_path):
    """safetensors.numpy writes an array's memory as it lies (a column-major array came back
    scrambled, measured): the exporters' writer makes each row-major first."""
    from safetensors.numpy import load_file

    from sheepop.interop.hf_files import WEIGHTS, write_weights
    weights = NumpyLM(cfg, init_params(cfg, seed=3)).params
    assert weights["tok_emb.weight"].flags.f_contiguous
    write_weights(tmp_path, weights)
    back = load_file(tmp_path / WEIGHTS)
    assert all(np.array_equal(back[name], w) for name, w in weights.items())
