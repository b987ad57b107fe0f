"""Every scratch layer's backward against central finite differences in float64 (rel <= 1e-6)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from scratch_gradcheck import check

from sheepop.scratch import attention as att
from sheepop.scratch import layers as L
from sheepop.scratch import norm as N
from sheepop.scratch import positions as P
from sheepop.scratch import rope
from sheepop.softmax import softmax

TOL = 1e-6


def rand(rng, *shape):
    return rng.standard_normal(shape)


@pytest.mark.parametrize("shape", [(3, 4), (2, 5, 7)])
def test_embedding(shape):
    rng = np.random.default_rng(1)
    table = rand(rng, 6, 4)
    idx = rng.integers(0, 6, shape)
    idx.reshape(-1)[:2] = 3  # a repeated token: its gradient rows must add up
    out, cache = L.embedding_forward(idx, table)
    dout = rand(rng, *out.shape)
    dtable = L.embedding_backward(dout, cache)
    check(lambda: L.embedding_forward(idx, table)[0], {"table": table}, {"table": dtable}, dout)
    assert np.all(dtable[np.setdiff1d(np.arange(6), idx)] == 0)


@pytest.mark.parametrize("start", [0, 3])
def test_learned_positions(start):
    rng = np.random.default_rng(2)
    table = rand(rng, 10, 4)

    def forward():
        x = np.zeros((3, 5, 4))
        return x + P.learned_positions_forward(table, slice(start, start + 5))[0]

    _, cache = P.learned_positions_forward(table, slice(start, start + 5))
    dout = rand(rng, 3, 5, 4)
    check(forward, {"table": table}, {"table": P.learned_positions_backward(dout, cache)}, dout)


@pytest.mark.parametrize("shape,bias", [((4, 3), True), ((2, 5, 3), True), ((2, 5, 3), False)])
def test_linear(shape, bias):
    rng = np.random.default_rng(3)
    x, w = rand(rng, *shape), rand(rng, 6, shape[-1])
    b = rand(rng, 6) if bias else None
    out, cache = L.linear_forward(x, w, b)
    dout = rand(rng, *out.shape)
    dx, dw, db = L.linear_backward(dout, cache)
    inputs, grads = {"x": x, "w": w}, {"x": dx, "w": dw}
    if bias:
        inputs["b"], grads["b"] = b, db
    else:
        assert db is None
    check(lambda: L.linear_forward(x, w, b)[0], inputs, grads, dout)


@pytest.mark.parametrize("shape", [(5, 8), (2, 3, 6), (1, 4, 3)])
def test_layernorm(shape):
    rng = np.random.default_rng(4)
    x = rand(rng, *shape) * 3 + 1
    gamma, beta = rand(rng, shape[-1]), rand(rng, shape[-1])
    out, cache = N.layernorm_forward(x, gamma, beta, 1e-5)
    dout = rand(rng, *out.shape)
    dx, dg, db = N.layernorm_backward(dout, cache)
    check(lambda: N.layernorm_forward(x, gamma, beta, 1e-5)[0],
          {"x": x, "gamma": gamma, "beta": beta}, {"x": dx, "gamma": dg, "beta": db}, dout)


def test_layernorm_forward_values():
    x = np.array([[1.0, 2.0, 3.0, 6.0]])
    y, _ = N.layernorm_forward(x, np.ones(4), np.zeros(4), 0.0)
    # mean 3, biased variance (4 + 1 + 0 + 9) / 4 = 3.5
    np.testing.assert_allclose(y, (x - 3.0) / np.sqrt(3.5), rtol=1e-14)


@pytest.mark.parametrize("name", ["gelu", "gelu_tanh", "relu", "relu2", "silu"])
def test_activations(name):
    rng = np.random.default_rng(5)
    x = rand(rng, 3, 4, 5) * 2
    x[np.abs(x) < 1e-3] = 0.5  # keep ReLU's kink away from the finite-difference step
    fwd, bwd = L.ACTIVATIONS[name]
    out, cache = fwd(x)
    dout = rand(rng, *out.shape)
    check(lambda: fwd(x)[0], {"x": x}, {"x": bwd(dout, cache)}, dout)


def test_dropout_mask_is_kept_in_the_cache():
    rng_data = np.random.default_rng(6)
    x = rand(rng_data, 4, 50)
    out, mask = L.dropout_forward(x, 0.3, np.random.default_rng(7))
    kept = out != 0
    assert 0.5 < kept.mean() < 0.9
    np.testing.assert_allclose(out[kept], x[kept] / 0.7, rtol=1e-15)
    dout = rand(rng_data, *x.shape)
    dx = L.dropout_backward(dout, mask)
    check(lambda: L.dropout_forward(x, 0.3, np.random.default_rng(7))[0], {"x": x}, {"x": dx},
          dout)
    same, none = L.dropout_forward(x, 0.3, None)
    assert same is x and none is None  # evaluation: identity


@pytest.mark.parametrize("shape", [(6, 5), (2, 4, 7)])
def test_cross_entropy_with_padding(shape):
    rng = np.random.default_rng(8)
    logits = rand(rng, *shape) * 2
    targets = rng.integers(0, shape[-1], shape[:-1])
    targets.reshape(-1)[[1, -1]] = L.IGNORE_INDEX
    loss, cache = L.cross_entropy_forward(logits, targets)
    # The reference: mean over counted rows of -log softmax(z)[y].
    z, y = logits.reshape(-1, shape[-1]), targets.reshape(-1)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    rows = y != -1
    assert abs(loss - (-logp[rows, y[rows]].mean())) < 1e-14
    dz = L.cross_entropy_backward(1.0, cache)
    assert np.all(dz.reshape(-1, shape[-1])[~rows] == 0)
    check(lambda: L.cross_entropy_forward(logits, targets)[0], {"logits": logits},
          {"logits": dz}, None)


def test_cross_entropy_without_targets_is_an_error():
    with pytest.raises(ValueError, match="no targets"):
        L.cross_entropy_forward(np.zeros((2, 3)), np.full(2, L.IGNORE_INDEX))


def test_softmax():
    rng = np.random.default_rng(9)
    s = rand(rng, 3, 6)
    a = softmax(s.copy())
    dout = rand(rng, 3, 6)
    check(lambda: softmax(s.copy()), {"s": s}, {"s": att.softmax_backward(dout, a)},
          dout)


@pytest.mark.parametrize("B,H,T,dk,p", [(1, 1, 4, 3, 0.0), (2, 3, 5, 2, 0.0), (2, 2, 4, 3, 0.25)])
def test_attention_core(B, H, T, dk, p):
    rng = np.random.default_rng(10)
    q, k, v = rand(rng, B, H, T, dk), rand(rng, B, H, T, dk), rand(rng, B, H, T, dk)

    def forward():
        gen = np.random.default_rng(11) if p else None  # the same dropout mask every call
        return att.attention_core_forward(q, k, v, p, gen)[0]

    y, cache = att.attention_core_forward(q, k, v, p, np.random.default_rng(11) if p else None)
    np.testing.assert_allclose(cache.a.sum(-1), 1.0, rtol=1e-14)
    assert np.all(np.triu(cache.a[0, 0], 1) == 0)  # causal: no weight on later positions
    dout = rand(rng, *y.shape)
    dq, dk_, dv = att.attention_core_backward(dout, cache)
    check(forward, {"q": q, "k": k, "v": v}, {"q": dq, "k": dk_, "v": dv}, dout)


@pytest.mark.parametrize("n_head,bias", [(1, True), (2, True), (4, False)])
def test_self_attention(n_head, bias):
    rng = np.random.default_rng(12)
    B, T, d = 2, 5, 8
    x = rand(rng, B, T, d)
    params = {"qkv.weight": rand(rng, 3 * d, d) * 0.5, "proj.weight": rand(rng, d, d) * 0.5,
              "qkv.bias": rand(rng, 3 * d) if bias else None,
              "proj.bias": rand(rng, d) if bias else None}

    def forward():
        return att.self_attention_forward(x, params["qkv.weight"], params["qkv.bias"],
                                          params["proj.weight"], params["proj.bias"], n_head)[0]

    _, cache = att.self_attention_forward(x, params["qkv.weight"], params["qkv.bias"],
                                          params["proj.weight"], params["proj.bias"], n_head)
    dout = rand(rng, B, T, d)
    dx, grads = att.self_attention_backward(dout, cache)
    inputs = {"x": x, **{k: v for k, v in params.items() if v is not None}}
    grads = {"x": dx, **grads}
    check(forward, inputs, grads, dout)


def test_self_attention_with_a_rotation_of_queries_and_keys():
    """The hook a rotary position kind uses (`rotate`): a per-position rotation of each pair of
    features of Q and K, here angle = position (one frequency); its backward rotates back."""
    rng = np.random.default_rng(13)
    B, T, d, H = 2, 5, 8, 2
    x = rand(rng, B, T, d)
    w_qkv, w_proj = rand(rng, 3 * d, d) * 0.5, rand(rng, d, d) * 0.5
    cos, sin = np.cos(np.arange(T))[:, None], np.sin(np.arange(T))[:, None]

    def turn(a, sign):
        even, odd = a[..., 0::2], a[..., 1::2]
        out = np.empty_like(a)
        out[..., 0::2] = even * cos - sign * odd * sin
        out[..., 1::2] = sign * even * sin + odd * cos
        return out

    # queries and keys come stacked on the head axis; R^T = R(-angle)
    rotate = (lambda qk: (turn(qk, 1), None), lambda dqk, _: turn(dqk, -1))

    def forward():
        return att.self_attention_forward(x, w_qkv, None, w_proj, None, H, rotate=rotate)[0]

    out, cache = att.self_attention_forward(x, w_qkv, None, w_proj, None, H, rotate=rotate)
    plain, _ = att.self_attention_forward(x, w_qkv, None, w_proj, None, H)
    assert np.allclose(out[:, 0], plain[:, 0])  # position 0: no rotation, and it sees only itself
    assert not np.allclose(out, plain)
    dout = rand(rng, B, T, d)
    dx, grads = att.self_attention_backward(dout, cache)
    check(forward, {"x": x, "w_qkv": w_qkv, "w_proj": w_proj},
          {"x": dx, "w_qkv": grads["qkv.weight"], "w_proj": grads["proj.weight"]}, dout)


@pytest.mark.parametrize("shape", [(5, 8), (2, 3, 6)])
def test_rmsnorm(shape):
    rng = np.random.default_rng(14)
    x = rand(rng, *shape) * 3 + 1
    gamma = rand(rng, shape[-1])
    out, cache = N.rmsnorm_forward(x, gamma, 1e-5)
    np.testing.assert_allclose(out, gamma * x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5))
    dout = rand(rng, *out.shape)
    dx, dg = N.rmsnorm_backward(dout, cache)
    check(lambda: N.rmsnorm_forward(x, gamma, 1e-5)[0], {"x": x, "gamma": gamma},
          {"x": dx, "gamma": dg}, dout)


def test_silu_values_and_sigmoid_without_overflow():
    x = np.array([-800.0, -2.0, 0.0, 1.5, 800.0])
    out, _ = L.silu_forward(x)
    expected = np.array([0.0, -2 / (1 + np.e ** 2), 0.0, 1.5 / (1 + np.exp(-1.5)), 800.0])
    np.testing.assert_allclose(out, expected, rtol=1e-15, atol=1e-300)
    with warnings.catch_warnings():  # e^-x overflows below -88 (float32): expected, silent
        warnings.simplefilter("error")
        tails = L.sigmoid(np.array([-1e4, -100.0, -80.0, 80.0, 1e4], dtype=np.float32))
    assert tails.dtype == np.float32
    np.testing.assert_array_equal(tails[[0, 1, 3, 4]], [0.0, 0.0, 1.0, 1.0])
    np.testing.assert_allclose(tails[2], np.exp(-80.0), rtol=1e-6)  # 1.8e-35, not rounded to 0
    grid = np.linspace(-30, 30, 2001, dtype=np.float32)
    np.testing.assert_allclose(L.sigmoid(grid), 1 / (1 + np.exp(-grid.astype(np.float64))),
                               rtol=1e-6, atol=0)


@pytest.mark.parametrize("H,H_kv,bias", [(4, 2, True), (4, 1, False), (2, 2, False)])
def test_grouped_query_attention(H, H_kv, bias):
    """Each key/value head serves H / H_kv query heads; its gradient sums theirs."""
    rng = np.random.default_rng(17)
    B, T, d = 2, 5, 8
    dk = d // H
    width = (H + 2 * H_kv) * dk
    x = rand(rng, B, T, d)
    params = {"qkv.weight": rand(rng, width, d) * 0.5, "proj.weight": rand(rng, d, d) * 0.5,
              "qkv.bias": rand(rng, width) if bias else None,
              "proj.bias": rand(rng, d) if bias else None}
    angles = lambda qk: rope.rope_rotate_forward(qk, slice(0, T), _RopeCfg(dk))  # noqa: E731
    rotate = (angles, rope.rope_rotate_backward)

    def forward():
        return att.self_attention_forward(x, params["qkv.weight"], params["qkv.bias"],
                                          params["proj.weight"], params["proj.bias"], H,
                                          rotate=rotate, n_kv_head=H_kv)[0]

    out, cache = att.self_attention_forward(x, params["qkv.weight"], params["qkv.bias"],
                                            params["proj.weight"], params["proj.bias"], H,
                                            rotate=rotate, n_kv_head=H_kv)
    # The same as multi-head attention whose key/value rows are each group's copied out.
    q_rows, kv = params["qkv.weight"][:H * dk], params["qkv.weight"][H * dk:]
    k_rows, v_rows = kv[:H_kv * dk], kv[H_kv * dk:]
    copy = lambda w: np.repeat(w.reshape(H_kv, dk, -1), H // H_kv, 0).reshape(H * dk, -1)  # noqa
    w_mha = np.concatenate([q_rows, copy(k_rows), copy(v_rows)])
    b_mha = None
    if bias:
        b = params["qkv.bias"][:, None]
        b_mha = np.concatenate([b[:H * dk], copy(b[H * dk:(H + H_kv) * dk]),
                                copy(b[(H + H_kv) * dk:])])[:, 0]
    mha, _ = att.self_attention_forward(x, w_mha, b_mha, params["proj.weight"],
                                        params["proj.bias"], H, rotate=rotate)
    np.testing.assert_allclose(out, mha, rtol=0, atol=1e-13)
    dout = rand(rng, B, T, d)
    dx, grads = att.self_attention_backward(dout, cache)
    inputs = {"x": x, **{k: v for k, v in params.items() if v is not None}}
    check(forward, inputs, {"x": dx, **grads}, dout)


class _RopeCfg:
    """The two settings rope reads from a ModelConfig."""

    def __init__(self, head_dim: int):
        self.head_dim, self.rope_theta = head_dim, 10000.0
