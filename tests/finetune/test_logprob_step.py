"""The primitive DPO and RL train through, in both engines: the per-token log-probability of given
targets under the loss mask, and a step on any differentiable function of it
(sheepop.train.logprobs). The NumPy engine's backward dL/dz_t = g_t (onehot(y_t) - softmax(z_t))
is checked against float64 finite differences and torch's autograd, alone and through the whole
model (full and LoRA); the engines take the same steps; under LoRA the base with the adapters off
stays where it started."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from float_tolerance import float32_tolerance, model_depth
from variants import ALL_LORA_TARGETS, gqa, llama

from sheepop.arch import IGNORE_INDEX
from sheepop.arch.lora import LoraConfig
from sheepop.config.schema import ModelConfig, TrainConfig
from sheepop.model.logprob import token_logprobs
from sheepop.scratch.init import init_params
from sheepop.scratch.layers import cross_entropy_backward, cross_entropy_forward
from sheepop.scratch.logprob import token_logprob_backward, token_logprob_forward
from sheepop.train.engine_numpy import NumpyEngine
from sheepop.train.engine_torch import TorchEngine

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CFG = ModelConfig(vocab_size=13, block_size=8, n_layer=2, n_embd=16, d_ff=24,
                  **llama(**gqa(4, 2)))
LORA = LoraConfig(4, 8.0, ALL_LORA_TARGETS)
TCFG = TrainConfig(steps=4, lr=3e-2, weight_decay=0.1, grad_clip=0.5, dtype="float64",
                   device="cpu", seed=3)


def sequence_loss(logp: np.ndarray) -> tuple[float, np.ndarray]:
    """A loss that is not linear in logp, and couples a row's tokens: mean_b softplus(-0.3 s_b)
    + 0.05 sum_bt w_bt logp_bt, s_b = sum_t logp_bt; and its gradient by hand."""
    w = np.linspace(-1.0, 1.0, logp.size).reshape(logp.shape)
    s = logp.sum(axis=-1)
    loss = np.mean(np.logaddexp(0.0, -0.3 * s)) + 0.05 * np.sum(w * logp)
    ds = -0.3 / (1.0 + np.exp(0.3 * s)) / len(s)
    return float(loss), ds[:, None] + 0.05 * w


def sequence_loss_torch(logp: torch.Tensor) -> torch.Tensor:
    w = torch.linspace(-1.0, 1.0, logp.numel(), dtype=logp.dtype).reshape(logp.shape)
    return torch.nn.functional.softplus(-0.3 * logp.sum(-1)).mean() + 0.05 * (w * logp).sum()


def targets(shape: tuple[int, int], seed: int) -> np.ndarray:
    y = np.random.default_rng(seed).integers(0, CFG.vocab_size, shape)
    y[0, :3] = IGNORE_INDEX  # a prompt: not counted
    y[-1, -2:] = IGNORE_INDEX  # padding
    return y


def test_the_weighted_logprob_backward_is_the_derivative():
    rng = np.random.default_rng(0)
    z = rng.standard_normal((3, 5, CFG.vocab_size)) * 2.0
    y = targets((3, 5), 1)
    logp, cache = token_logprob_forward(z, y)
    assert np.all(logp[y == IGNORE_INDEX] == 0.0)
    zs = z - z.max(-1, keepdims=True)
    expected = np.take_along_axis(zs - np.log(np.exp(zs).sum(-1, keepdims=True)),
                                  np.maximum(y, 0)[..., None], -1)[..., 0]
    np.testing.assert_allclose(logp[y != IGNORE_INDEX], expected[y != IGNORE_INDEX], rtol=1e-14)
    _, g = sequence_loss(logp)
    dz = token_logprob_backward(g, cache)
    assert np.all(dz[y == IGNORE_INDEX] == 0.0)  # the mask: no gradient, whatever g says
    h, numeric = 1e-6, np.zeros_like(z)
    for index in np.ndindex(z.shape):
        up, down = z.copy(), z.copy()
        up[index] += h
        down[index] -= h
        numeric[index] = (sequence_loss(token_logprob_forward(up, y)[0])[0]
                          - sequence_loss(token_logprob_forward(down, y)[0])[0]) / (2 * h)
    np.testing.assert_allclose(dz, numeric, atol=1e-9)
    zt = torch.tensor(z, requires_grad=True)
    sequence_loss_torch(token_logprobs(zt, torch.from_numpy(y))).backward()
    np.testing.assert_allclose(dz, zt.grad.numpy(), rtol=1e-12, atol=1e-15)


def test_the_cross_entropy_is_the_case_g_minus_one_over_n():
    rng = np.random.default_rng(2)
    z = rng.standard_normal((2, 6, CFG.vocab_size))
    y = targets((2, 6), 3)
    n = int((y != IGNORE_INDEX).sum())
    logp, cache = token_logprob_forward(z, y)
    loss, ce_cache = cross_entropy_forward(z, y)
    assert loss == pytest.approx(-logp.sum() / n, rel=1e-14)
    np.testing.assert_allclose(token_logprob_backward(np.full(y.shape, -1.0 / n), cache),
                               cross_entropy_backward(1.0, ce_cache), atol=1e-16)


def base_weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    params = init_params(CFG, 0, np.float64)
    for v in params.values():
        v += rng.standard_normal(v.shape) * (0.2 if v.ndim > 1 else 0.1)
    return params


def torch_engine(weights, lora=None, dtype="float64") -> TorchEngine:
    engine = TorchEngine(CFG, dataclasses.replace(TCFG, dtype="float32"), weights, lora)
    if dtype == "float64":
        engine.model.double()  # in place: the optimizer keeps the same Parameter objects
        with torch.no_grad():  # the float64 weights exactly (loading went through float32)
            for name, p in engine.model.named_parameters():
                if name in weights:
                    p.copy_(torch.from_numpy(weights[name]))
    return engine


def numpy_engine(weights, lora=None, dtype="float64") -> NumpyEngine:
    return NumpyEngine(CFG, dataclasses.replace(TCFG, dtype=dtype), weights, lora)


def batches() -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(5)
    return [(rng.integers(0, CFG.vocab_size, (B, 6)), targets((B, 6), 6 + B)) for B in (2, 3)]


@pytest.mark.parametrize("lora", [None, LORA], ids=["full", "lora"])
def test_the_model_gradient_equals_autograd_and_finite_differences(lora):
    weights = base_weights()
    ours, theirs = numpy_engine(weights, lora), torch_engine(weights, lora)
    if lora is not None:  # adapters away from B = 0, so every path carries a gradient
        rng = np.random.default_rng(9)
        for name, g in ours.model.grads.items():
            ours.model.params[name][...] = rng.standard_normal(g.shape) * 0.3
        with torch.no_grad():
            for name in ours.model.grads:
                theirs.model.get_parameter(name).copy_(torch.from_numpy(ours.model.params[name]))
    x, y = batches()[1]

    def numpy_loss() -> float:
        return sequence_loss(ours.token_logprobs(x, y))[0]

    ours.model.zero_grad()
    logits, _ = ours.model.forward(x)
    logp, cache = token_logprob_forward(logits, y)
    ours.model.backward(dlogits=token_logprob_backward(sequence_loss(logp)[1], cache))
    theirs.model.train()
    out, _ = theirs.model(torch.from_numpy(x))
    sequence_loss_torch(token_logprobs(out, torch.from_numpy(y))).backward()
    for name, g in ours.model.grads.items():
        np.testing.assert_allclose(g, theirs.model.get_parameter(name).grad.numpy(),
                                   rtol=1e-9, atol=1e-12, err_msg=name)
    rng = np.random.default_rng(1)
    for name in list(ours.model.grads)[::3]:  # a few entries of every third parameter
        p = ours.model.params[name]
        for flat in rng.choice(p.size, 2, replace=False):
            index, keep = np.unravel_index(flat, p.shape), p.flat[flat]
            p[index] = keep + 1e-6
            up = numpy_loss()
            p[index] = keep - 1e-6
            down = numpy_loss()
            p[index] = keep
            assert ours.model.grads[name][index] == pytest.approx((up - down) / 2e-6,
                                                                  rel=1e-5, abs=1e-8), name


def step_loss(i: int, logp: np.ndarray) -> tuple[float, np.ndarray]:
    loss, g = sequence_loss(logp)
    return loss / 2, g / 2  # the step's mean over its two batches


@pytest.mark.parametrize("lora", [None, LORA], ids=["full", "lora"])
def test_the_engines_take_the_same_steps(lora):
    weights = base_weights()
    ours, theirs = numpy_engine(weights, lora), torch_engine(weights, lora)
    for step in range(4):
        (a, norm_a), (b, norm_b) = (engine.logprob_step(batches(), 3e-2, step_loss)
                                    for engine in (ours, theirs))
        # (AdamW's g / (sqrt(v) + eps) turns float64 rounding of a gradient entry near 0, e.g.
        # the adapters' A at B = 0, into a visible step: 1e-6, as tests/train/test_lora_engines)
        assert a == pytest.approx(b, rel=1e-6), step
        assert norm_a == pytest.approx(norm_b, rel=1e-6), step
    x, y = batches()[0]
    moved = ours.token_logprobs(x, y)
    np.testing.assert_allclose(moved, theirs.token_logprobs(x, y), rtol=1e-6)
    assert sequence_loss(moved)[0] < sequence_loss(numpy_engine(weights).token_logprobs(x, y))[0]


def test_the_engines_agree_in_float32():
    weights = {k: v.astype(np.float32) for k, v in base_weights().items()}
    x, y = batches()[1]
    a = numpy_engine(weights, dtype="float32").token_logprobs(x, y)
    b = torch_engine(weights, dtype="float32").token_logprobs(x, y)
    magnitude = float(np.abs(a).max())
    np.testing.assert_allclose(a, b, rtol=0, atol=float32_tolerance(
        max(CFG.n_embd, CFG.vocab_size, CFG.d_ff), model_depth(CFG.n_layer) + 1, magnitude))


@pytest.mark.parametrize("make", [numpy_engine, torch_engine], ids=["numpy", "torch"])
def test_the_base_with_the_adapters_off_stays_put(make):
    weights = base_weights()
    x, y = batches()[0]
    base = make(weights).token_logprobs(x, y)
    engine = make(weights, LORA)
    np.testing.assert_allclose(engine.token_logprobs(x, y), base, rtol=1e-12)  # B = 0
    for _ in range(3):
        engine.logprob_step(batches(), 3e-2, step_loss)
    assert np.abs(engine.token_logprobs(x, y) - base).max() > 1e-2  # the adapters moved it
    np.testing.assert_allclose(engine.token_logprobs(x, y, adapters_off=True), base,
                               rtol=1e-12)
    np.testing.assert_allclose(engine.token_logprobs(x, y), engine.token_logprobs(x, y))
    with pytest.raises(ValueError, match="LoRA"):
        make(weights).token_logprobs(x, y, adapters_off=True)
