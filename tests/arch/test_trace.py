"""The step-by-step trace (sheepop.scratch.token_steps: one token through the model, the NumPy
engine's pass read at its hook points) against both engines: its logits equal each engine's,
its softmax rows equal sheepop.inference.load.inspect's attention rows, its steps add up as
docs/math says; and sheepop.train.backward_step (the NumPy engine's hand-written backward pass)
against torch autograd on the same weights."""

import math

import numpy as np
import pytest
import torch
from float_tolerance import float32_tolerance
from variants import gqa, llama

from sheepop.config.schema import Config, ModelConfig
from sheepop.errors import UserError
from sheepop.inference.load import build, inspect
from sheepop.inference.weights import model_weights
from sheepop.model import GPT
from sheepop.positional import sinusoidal_table
from sheepop.scratch import gpt_forward
from sheepop.scratch.init import param_shapes
from sheepop.scratch.token_steps import trace_token
from sheepop.tokenizers import train_tokenizer
from sheepop.train.backward_step import backward_step

TEXT = "the cat sat on the mat. "
KINDS = {  # every layer kind the trace follows
    "gpt": dict(pos_encoding="sinusoidal"),
    "learned": dict(pos_encoding="learned", head_bias=True, activation="gelu_tanh"),
    "relu": dict(pos_encoding="none", activation="relu", tie_weights=False),
    "llama": llama(rope_theta=100.0, **gqa(4, 2)),
    "modern": dict(pos_encoding="learned", activation="relu2", bias=False, logit_softcap=2.0),
}


def weights(cfg: ModelConfig, seed: int = 7) -> dict[str, np.ndarray]:
    """Random weights of size ~0.5 (gains near 1): logits spread well beyond rounding."""
    rng = np.random.default_rng(seed)
    return {k: (rng.normal(size=s) * (0.5 if len(s) > 1 else 0.2)
                + (1.0 if k.endswith("weight") and len(s) == 1 else 0.0)).astype(np.float32)
            for k, s in param_shapes(cfg).items()}


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer("char", [TEXT], 0)


def config(tokenizer, kind: str) -> Config:
    cfg = Config()
    cfg.model = ModelConfig(**{**dict(vocab_size=tokenizer.vocab_size, block_size=16,
                                      n_layer=3, n_head=2, n_embd=16), **KINDS[kind]})
    return cfg


def engine_logits(cfg: ModelConfig, w: dict, ids: list[int], engine: str) -> np.ndarray:
    if engine == "numpy":
        return gpt_forward(w, cfg, np.asarray([ids]))[0][0]
    model = GPT(cfg)
    model.load_numpy_weights(w)
    with torch.no_grad():
        return model(torch.tensor([ids]))[0][0].numpy()


@pytest.mark.parametrize("engine", ["numpy", "torch"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_the_trace_gives_the_engines_logits_and_attention_rows(tokenizer, kind, engine):
    cfg = config(tokenizer, kind)
    model = build(cfg, weights(cfg.model), tokenizer, engine=engine)
    ids = tokenizer.encode(TEXT)[:12]
    seen = inspect(model, ids, lens=False)
    w = model_weights(model)
    reference = engine_logits(cfg.model, w, ids, engine)
    for t, layer in ((0, 0), (5, 1), (11, 2)):
        x = trace_token(w, cfg.model, ids, t, layer)
        assert np.abs(x.logits - reference[t]).max() < 1e-4
        for h, head in enumerate(x.heads):
            row = seen.attention[layer][h][t]
            assert np.abs(head.weights[:t + 1] - row[:t + 1]).max() < 1e-5  # float32 orders
            assert (head.weights[t + 1:] == 0).all() and not head.allowed[t + 1:].any()
            assert head.allowed[:t + 1].all()
            assert abs(head.weights.sum() - 1) < 1e-6


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_steps_add_up_as_the_docs_write_them(tokenizer, kind):
    cfg = config(tokenizer, kind)
    m = cfg.model
    w = weights(m)
    ids = tokenizer.encode(TEXT)[:10]
    x = trace_token(w, m, ids, 6, 1)
    first = trace_token(w, m, ids, 6, 0)
    # h^(0)_t = E[x_t] + P[t] (s P for the sinusoidal table)
    h0 = w["tok_emb.weight"][ids[6]].astype(np.float64)
    if m.pos_encoding == "sinusoidal":
        table = m.sinusoid_scale * sinusoidal_table(7, 16)[6]  # float64; the trace's float32
        np.testing.assert_allclose(first.pos_term, table, rtol=0,
                                   atol=float32_tolerance(1, 1, np.abs(table).max()))
    if first.pos_term is not None:
        h0 = h0 + first.pos_term
    np.testing.assert_allclose(first.h_in, h0, atol=1e-6)
    # the stream: the block's input plus the attention, plus the FFN; its norm recorded
    np.testing.assert_allclose(x.x1, x.h_in + x.attn_out, atol=1e-6)
    np.testing.assert_allclose(x.x2, x.x1 + x.ffn.out, atol=1e-6)
    assert math.isclose(x.stream_norms[1], np.linalg.norm(x.h_in), rel_tol=1e-6)
    assert math.isclose(x.stream_norms[2], np.linalg.norm(x.x2), rel_tol=1e-6)
    # the norm: x_hat has mean 0 and variance 1 (layernorm) or mean square 1 (rmsnorm)
    n = x.norm1
    eps = m.ln_eps
    if m.norm == "layernorm":
        assert abs(n.x_hat.mean()) < 1e-5
        assert math.isclose(np.mean(n.x_hat ** 2), n.var / (n.var + eps), rel_tol=1e-4)
        assert math.isclose(n.mean, n.x.mean(), rel_tol=1e-5, abs_tol=1e-7)
    else:
        assert n.mean is None
        assert math.isclose(n.var, np.mean(n.x.astype(np.float64) ** 2), rel_tol=1e-5)
    # scores: q . k_j / sqrt(d_k); RoPE turns q and k without changing their lengths
    for head in x.heads:
        assert math.isclose(np.linalg.norm(head.q), np.linalg.norm(head.q_pre), rel_tol=1e-5)
        assert math.isclose(head.raw[6], head.q @ head.k / math.sqrt(m.head_dim),
                            rel_tol=1e-5, abs_tol=1e-6)
        if m.pos_encoding != "rope":
            np.testing.assert_array_equal(head.q, head.q_pre)
    np.testing.assert_allclose(x.concat, np.concatenate([h.out for h in x.heads]))
    # the heads that share a key/value head (grouped-query attention) read the same k and v
    assert [h.kv_head for h in x.heads] == [h // (m.n_head // m.kv_heads)
                                            for h in range(m.n_head)]
    # the final norm reads the last block's output at t; the logits are its product with the head
    head_w = w.get("head.weight", w["tok_emb.weight"])
    z = x.final_norm.y @ head_w.T + w.get("head.bias", 0)
    if m.logit_softcap:  # then capped: c tanh(z / c)
        z = m.logit_softcap * np.tanh(z / m.logit_softcap)
        assert np.abs(z).max() < m.logit_softcap
    np.testing.assert_allclose(x.logits, z, atol=1e-5)


def test_the_trace_refuses_what_it_does_not_follow(tokenizer):
    cfg = config(tokenizer, "gpt")
    cfg.model.digit_positions = 4
    with pytest.raises(UserError, match="digit places"):
        trace_token(weights(config(tokenizer, "gpt").model), cfg.model, [1, 2], 0, 0)
    with pytest.raises(UserError, match="position 5"):
        trace_token(weights(config(tokenizer, "gpt").model), config(tokenizer, "gpt").model,
                    [1, 2], 5, 0)


def autograd(cfg: ModelConfig, w: dict, ids: list[int]) -> tuple[float, np.ndarray, dict]:
    """(loss, dL/dlogits, dL/dW) by torch autograd on the same weights, in their dtype."""
    model = GPT(cfg)
    if next(iter(w.values())).dtype == np.float64:
        model = model.double()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.from_numpy(w[name]))
    x, y = torch.tensor([ids[:-1]]), torch.tensor([ids[1:]])
    logits, loss = model(x, y)[:2]
    logits.retain_grad()
    loss.backward()
    grads = {n: p.grad.numpy() for n, p in model.named_parameters()}
    return float(loss.detach()), logits.grad[0].numpy(), grads


@pytest.mark.parametrize("dtype,tol", [(np.float32, 1e-5), (np.float64, 1e-7)])
@pytest.mark.parametrize("kind", ["gpt", "llama"])
def test_the_hand_written_backward_gives_what_autograd_gives(tokenizer, kind, dtype, tol):
    cfg = config(tokenizer, kind).model
    w = {k: v.astype(dtype) for k, v in weights(cfg).items()}
    ids = tokenizer.encode(TEXT)[:13]
    step = backward_step(w, cfg, ids)
    loss, dz, grads = autograd(cfg, w, ids)
    assert math.isclose(step.loss, loss, rel_tol=tol)
    assert np.abs(step.dz - dz).max() <= tol * np.abs(dz).max()
    assert set(step.grads) == set(grads)
    for name, g in grads.items():
        mine = np.linalg.norm(step.grads[name].astype(np.float64))
        assert math.isclose(mine, np.linalg.norm(g.astype(np.float64)), rel_tol=tol), name
    # dZ = (P - Y) / N: each row sums to 0, and the target's entry is (p - 1) / N
    assert np.abs(step.dz.sum(axis=-1)).max() < 1e-12
    n = len(ids) - 1
    assert math.isclose(step.dz[3, ids[4]], (step.probs[3, ids[4]] - 1) / n, rel_tol=1e-12)


@pytest.mark.real_model
@pytest.mark.parametrize("engine", ["numpy"])
def test_the_trace_gives_smollm2s_logits(smollm2_run, engine):
    """SmolLM2 (30 layers, 9 heads sharing 3 key/value heads, RMSNorm, SwiGLU, RoPE, a tied
    49,152-token head): the trace's logits are the engine's (measured: within 2.5e-5 of the
    NumPy engine's, 3.4e-5 of torch's, |z| ~ 20) and its softmax rows inspect's. One engine
    here: the trace reads neither, the toys above compare it with both, and the two engines'
    SmolLM2 logits agree with transformers' (tests/interop/test_gguf_smollm2.py)."""
    from sheepop.inference.load import load
    model = load(smollm2_run, engine=engine)
    ids = model.tokenizer.encode("The capital of France is Paris. The capital of Germany is")
    w = model_weights(model)
    if engine == "numpy":
        reference = gpt_forward(model.lm.params, model.config.model, np.asarray([ids]))[0][0]
    else:
        with torch.no_grad():
            reference = model.lm.model(torch.tensor([ids]))[0][0].numpy()
    seen = inspect(model, ids, lens=False)
    for t, layer in ((4, 0), (len(ids) - 1, 12)):
        x = trace_token(w, model.config.model, ids, t, layer)
        assert np.abs(x.logits - reference[t]).max() < 1e-4
        for h, head in enumerate(x.heads):
            assert np.abs(head.weights[:t + 1] - seen.attention[layer][h][t][:t + 1]).max() < 1e-5
    assert model.tokenizer.decode([int(np.argmax(x.logits))]) == " Berlin"
