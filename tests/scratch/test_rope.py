"""The NumPy engine's rotation (sheepop.scratch.rope): the pair formula, the backward against
finite differences, promotion across float widths, and the offset property of RoPE's scores."""

from __future__ import annotations

import numpy as np
import pytest
from scratch_gradcheck import check

from sheepop.scratch import rope


@pytest.mark.parametrize("pos", [slice(0, 5), slice(7, 12), "rows"])
def test_rope_rotation_and_its_backward(pos):
    """Pairs (2i, 2i+1) turn by p * theta^(-2i/d_k); the backward is the opposite turn."""
    rng = np.random.default_rng(15)
    B, H, T, dk = 2, 3, 5, 8
    if pos == "rows":  # per-row positions (left-padded batches)
        pos = np.array([[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]])
    angles = rope.rope_angles(pos, dk, 10000.0, np.float64)
    x = rng.standard_normal((B, H, T, dk))
    out = rope.rope_forward(x, angles)
    p = np.arange(pos.start, pos.stop)[None, None, :] if isinstance(pos, slice) else pos[:, None]
    for i in range(dk // 2):  # the defining formula, pair by pair
        a = p * 10000.0 ** (-2 * i / dk)
        np.testing.assert_allclose(out[..., 2 * i],
                                   x[..., 2 * i] * np.cos(a) - x[..., 2 * i + 1] * np.sin(a),
                                   rtol=0, atol=1e-14)
        np.testing.assert_allclose(out[..., 2 * i + 1],
                                   x[..., 2 * i] * np.sin(a) + x[..., 2 * i + 1] * np.cos(a),
                                   rtol=0, atol=1e-14)
    np.testing.assert_allclose(np.linalg.norm(out, axis=-1), np.linalg.norm(x, axis=-1))
    dout = rng.standard_normal(out.shape)
    np.testing.assert_allclose(rope.rope_backward(rope.rope_forward(dout, angles), angles), dout,
                               atol=1e-14)  # R^T R = I
    check(lambda: rope.rope_forward(x, angles), {"x": x}, {"x": rope.rope_backward(dout, angles)},
          dout)


@pytest.mark.parametrize("x_dtype", [np.float32, np.float64])
@pytest.mark.parametrize("angle_dtype", [np.float32, np.float64])
def test_rope_promotes_as_real_arithmetic_would(x_dtype, angle_dtype):
    """The turn reads each pair as one complex number of the input's own width, so inputs and
    angles of different widths promote as the pair formula's real products would (a float64
    input read as complex64 would turn garbage); non-contiguous pairs are copied first."""
    rng = np.random.default_rng(17)
    x = rng.standard_normal((2, 3, 4, 16)).astype(x_dtype)
    angles = rope.rope_angles(slice(3, 7), 16, 10000.0, angle_dtype)
    cos, sin = angles.cos, angles.sin
    want = np.empty(x.shape, np.result_type(x_dtype, angle_dtype))
    want[..., 0::2] = x[..., 0::2] * cos - x[..., 1::2] * sin
    want[..., 1::2] = x[..., 0::2] * sin + x[..., 1::2] * cos
    out = rope.rope_forward(x, angles)
    assert out.dtype == want.dtype
    np.testing.assert_allclose(out, want, rtol=0, atol=2e-6)
    strided = np.concatenate([x, x], axis=-1)[..., ::2]  # pairs not side by side in memory
    np.testing.assert_allclose(rope.rope_forward(strided, angles),
                               rope.rope_forward(np.ascontiguousarray(strided), angles))


def test_rope_dot_products_depend_only_on_the_offset():
    rng = np.random.default_rng(16)
    q, k = rng.standard_normal((2, 1, 1, 1, 16))

    def turn(x, p):
        return rope.rope_forward(x, rope.rope_angles(slice(p, p + 1), 16, 10000.0, np.float64))

    def dot(m, n):
        return float(np.sum(turn(q, m) * turn(k, n)))

    assert dot(3, 1) == pytest.approx(dot(1003, 1001), abs=1e-12)
    assert dot(3, 1) == pytest.approx(dot(2, 0), abs=1e-12)
    assert dot(3, 1) != pytest.approx(dot(3, 2), abs=1e-3)
