"""The NumPy Muon (scratch/muon.py): its iteration is the SVD's polynomial, in float32 it is the
float64 iteration within float32's precision, and its steps are torch.optim.Muon's within
bfloat16's (torch runs the iteration in bfloat16).

Tolerances. A matrix product of length n rounds each entry by about u sqrt(n) of its size (n
roundings of relative size u, adding like a random walk; u = 2^-24 for float32, 2^-8 for
bfloat16); a Newton-Schulz step is three such products and k steps add their errors, so the
relative (Frobenius) error of NS_k is within k sqrt(n) u, with n the longer side. A wrong
iteration (one step more or less, other coefficients) is off by ~0.35 relative: far outside
even bfloat16's bound (0.19 at 5 steps, n = 96).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sheepop.arch.params import uses_muon
from sheepop.config.presets import PRESETS
from sheepop.config.schema import ModelConfig
from sheepop.scratch.init import param_shapes
from sheepop.scratch.muon import (
    NS_COEFFICIENTS,
    NS_STEPS,
    Muon,
    left_factor,
    lerp,
    lr_scale,
    orthogonalize,
)

SHAPES = [(32, 96), (96, 32), (48, 48)]
UNIT_ROUNDOFF = {"float32": 2.0 ** -24, "bfloat16": 2.0 ** -8}


def relative(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def ns_tolerance(shape: tuple[int, int], dtype: str, steps: int = NS_STEPS) -> float:
    return steps * np.sqrt(max(shape)) * UNIT_ROUNDOFF[dtype]


@pytest.mark.parametrize("shape", SHAPES)
def test_the_iteration_is_the_polynomial_of_the_singular_values(shape):
    """NS_k(M) = U p^k(S / ||M||_F) V^T exactly (float64): the singular vectors stay, each
    singular value goes through p(s) = a s + b s^3 + c s^5 k times, and ends near 1."""
    m = np.random.default_rng(0).standard_normal(shape)
    u, s, vt = np.linalg.svd(m, full_matrices=False)
    a, b, c = NS_COEFFICIENTS
    s = s / np.linalg.norm(m)
    for _ in range(NS_STEPS):
        s = a * s + b * s ** 3 + c * s ** 5
    np.testing.assert_allclose(orthogonalize(m), (u * s) @ vt, rtol=0, atol=1e-12)
    assert 0.6 < s.min() and s.max() < 1.25  # every direction of M now about the same size


def plain_iteration(m: np.ndarray, steps: int = NS_STEPS) -> np.ndarray:
    """The iteration as defined, X <- a X + (b A + c A^2) X on the side with fewer rows."""
    a, b, c = NS_COEFFICIENTS
    x = m.T if m.shape[0] > m.shape[1] else m
    x = x / np.linalg.norm(x)
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * (gram @ gram)) @ x
    return x.T if m.shape[0] > m.shape[1] else x


@pytest.mark.parametrize("shape", [(32, 96), (96, 32), (20, 31), (31, 20), (20, 30)])
@pytest.mark.parametrize("steps", [1, 2, NS_STEPS])
def test_the_gram_form_is_the_plain_iteration(shape, steps):
    """A matrix over 1.5x as wide as tall goes through Q_{k-1} ... Q_0 X_0 (scratch/muon.py):
    the same polynomial, so in float64 it is the plain iteration to rounding; (20, 30) stays on
    the plain path and is equal bit for bit."""
    m = np.random.default_rng(2).standard_normal(shape)
    got, want = orthogonalize(m, steps), plain_iteration(m, steps)
    x = m.T if shape[0] > shape[1] else m
    x = x / np.linalg.norm(x)
    through_gram = left_factor(x @ x.T, steps, *NS_COEFFICIENTS) @ x
    assert relative(through_gram.T if shape[0] > shape[1] else through_gram, want) < 1e-13
    if max(shape) > 1.5 * min(shape):
        assert relative(got, want) < 1e-13
        assert relative(got, plain_iteration(m, steps + 1)) > 1e-3
    else:
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("shape", SHAPES)
def test_float32_is_the_float64_iteration_within_float32_precision(shape):
    m = np.random.default_rng(1).standard_normal(shape)
    o32 = orthogonalize(m.astype(np.float32))
    assert o32.dtype == np.float32
    assert relative(o32, orthogonalize(m)) <= ns_tolerance(shape, "float32")
    # the bound tells iterations apart: one step fewer is far outside it
    assert relative(orthogonalize(m, NS_STEPS - 1), orthogonalize(m)) > ns_tolerance(
        shape, "bfloat16")


@pytest.mark.parametrize("nesterov", [True, False])
@pytest.mark.parametrize("shape", SHAPES)
def test_steps_equal_torch_muon_within_bfloat16(shape, nesterov):
    """Four steps on the same gradients: the momentum buffer within float32's rounding of one
    lerp, the update within bfloat16's bound (the parameters re-synced after each step, so one
    step's difference is measured, not four compounded)."""
    rng = np.random.default_rng(2)
    w = rng.standard_normal(shape).astype(np.float32) * 0.02
    ours = Muon({"w": w.copy()}, lr=0.02, momentum=0.95, nesterov=nesterov, weight_decay=0.1)
    param = torch.nn.Parameter(torch.tensor(w))
    theirs = torch.optim.Muon([param], lr=0.02, momentum=0.95, nesterov=nesterov,
                              weight_decay=0.1)
    for _ in range(4):
        g = rng.standard_normal(shape).astype(np.float32)
        before = param.detach().numpy().copy()
        ours.params["w"][...] = before
        param.grad = torch.tensor(g)
        theirs.step()
        ours.step({"w": g})
        buf = theirs.state[param]["momentum_buffer"].numpy()
        np.testing.assert_allclose(ours.momentum_buffer["w"], buf, rtol=0,
                                   atol=4 * UNIT_ROUNDOFF["float32"] * np.abs(buf).max())
        ours.momentum_buffer["w"][...] = buf
        step_theirs = param.detach().numpy() - before
        assert relative(ours.params["w"] - before, step_theirs) <= ns_tolerance(shape,
                                                                               "bfloat16")


def test_the_scaled_update_has_entries_of_one_over_root_fan_in():
    """O has min(m, n) singular values near 1, so its entries' RMS is ~1/sqrt(max(m, n));
    times sqrt(max(1, m/n)) it is ~1/sqrt(n), n the input width, for tall and wide alike."""
    assert lr_scale((96, 32)) == pytest.approx(np.sqrt(3)) and lr_scale((32, 96)) == 1.0
    for shape in [(96, 32), (32, 96)]:
        o = orthogonalize(np.random.default_rng(3).standard_normal(shape))
        rms = lr_scale(shape) * np.sqrt(np.mean(o ** 2))
        assert rms * np.sqrt(shape[1]) == pytest.approx(1.0, abs=0.2)  # s in [0.6, 1.25]


def test_lerp_rounds_from_the_nearer_end():
    start, end = np.float32([1.0]), np.float32([3.0])
    assert lerp(start, end, 0.25)[0] == np.float32(1.5)
    assert lerp(start, end, 0.95)[0] == np.float32(3.0) - np.float32(2.0) * np.float32(0.05)


def test_muon_takes_matrices_only():
    with pytest.raises(ValueError, match="ln.weight"):
        Muon({"ln.weight": np.ones(4, dtype=np.float32)})
    with pytest.raises(ValueError, match="matrices"):
        orthogonalize(np.ones((2, 2, 2)))


def test_state_round_trips():
    rng = np.random.default_rng(4)
    params = {"w": rng.standard_normal((8, 4)).astype(np.float32)}
    opt = Muon(params)
    opt.step({"w": rng.standard_normal((8, 4)).astype(np.float32)})
    restored = Muon({"w": params["w"].copy()})
    restored.load_state_arrays(opt.state_arrays())
    np.testing.assert_array_equal(restored.momentum_buffer["w"], opt.momentum_buffer["w"])


def test_muon_takes_the_blocks_matrices_and_adamw_the_rest():
    cfg = ModelConfig(**{**PRESETS["tiny-llama"]["model"], "vocab_size": 64})
    muon = sorted(n for n, s in param_shapes(cfg).items() if uses_muon(n, s))
    assert muon and all(n.startswith("blocks.") and n.endswith(".weight") for n in muon)
    others = {n for n, s in param_shapes(cfg).items() if not uses_muon(n, s)}
    assert {"tok_emb.weight", "head.weight"} <= others
    assert not any(".attn." in n or ".ffn." in n for n in others)
