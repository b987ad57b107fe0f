"""The two links across the stack as units: value embeddings' mix (scratch/value_embeds.py,
model/value_embeds.py) and the U-net's skips (scratch/skips.py, model/skips.py), each backward
against float64 finite differences and against torch autograd. (The whole model with them:
test_scratch_model_grad.py and test_scratch_vs_torch.py; the model's behaviour:
tests/model/test_links.py.)"""

from __future__ import annotations

import numpy as np
import torch
from scratch_gradcheck import check

from sheepop.config.schema import ModelConfig
from sheepop.model.skips import Skips
from sheepop.model.value_embeds import mix_values
from sheepop.scratch.skips import (
    skip_backward,
    skip_forward,
    skip_keep,
    skip_kept_backward,
    skips_start,
)
from sheepop.scratch.value_embeds import ValueMix, value_mix_backward, value_mix_forward


def test_the_value_mix_backward_is_the_gradient_and_autograds():
    rng = np.random.default_rng(0)
    B, H, T, dk = 2, 3, 5, 4
    v = rng.standard_normal((B, H, T, dk))
    rows = rng.standard_normal((B, T, H * dk))
    lam = np.array(0.3)
    out, cache = value_mix_forward(v, ValueMix(rows, lam))
    # the mix, entry by entry: value head h of position t reads columns h*dk:(h+1)*dk of R_t
    np.testing.assert_allclose(out[1, 2, 4], 0.3 * v[1, 2, 4] + 0.7 * rows[1, 4, 8:12],
                               rtol=1e-15)
    dout = rng.standard_normal(out.shape)
    dv, (drows, dlam) = value_mix_backward(dout, cache)
    check(lambda: value_mix_forward(v, ValueMix(rows, lam))[0],
          {"v": v, "rows": rows, "lam": lam}, {"v": dv, "rows": drows, "lam": dlam}, dout)
    tv, trows, tlam = (torch.tensor(a, requires_grad=True) for a in (v, rows, lam))
    theirs = mix_values(tv, (trows, tlam))
    theirs.backward(torch.from_numpy(dout))
    np.testing.assert_allclose(theirs.detach().numpy(), out, rtol=1e-14, atol=1e-15)
    for ours, t in ((dv, tv), (drows, trows), (dlam, tlam)):
        np.testing.assert_allclose(ours, t.grad.numpy(), rtol=1e-12, atol=1e-14)


def toy_stack(n_layer: int, d: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Blocks h -> tanh(h A_i) (a nonlinear stand-in for the transformer's blocks)."""
    return [rng.standard_normal((d, d)) / np.sqrt(d) for _ in range(n_layer)]


def test_the_skips_backward_is_the_gradient_and_autograds():
    rng = np.random.default_rng(1)
    cfg = ModelConfig(n_layer=5, unet_skips=True)  # skips 0 -> 4 and 1 -> 3, block 2 none
    mats = toy_stack(cfg.n_layer, 6, rng)
    params = {"skips.weights": np.array([0.7, -1.3])}
    x = rng.standard_normal((2, 3, 6))

    def forward():
        cache = skips_start(params, cfg)
        h, hs = x, []
        for i, a in enumerate(mats):
            h = skip_forward(h, i, cache)
            hs.append(h)
            h = np.tanh(h @ a)
            skip_keep(h, i, cache)
        return h, hs, cache

    out, inputs, cache = forward()
    assert sorted(cache.kept) == [0, 1]
    dout = rng.standard_normal(out.shape)
    dh, dkept, dweights = dout, {}, np.zeros(2)
    for i in reversed(range(cfg.n_layer)):
        dh = skip_kept_backward(dh, i, dkept)
        dh = (dh * (1 - np.tanh(inputs[i] @ mats[i]) ** 2)) @ mats[i].T
        skip_backward(dh, i, cache, dkept, dweights)
    assert dkept == {}  # every kept output received its skip's gradient
    check(lambda: forward()[0], {"x": x, "skips.weights": params["skips.weights"]},
          {"x": dh, "skips.weights": dweights}, dout)

    skips = Skips(cfg).double()
    with torch.no_grad():
        skips.weights.copy_(torch.from_numpy(params["skips.weights"]))
    tx = torch.tensor(x, requires_grad=True)
    theirs = skips(tx, lambda i, h: torch.tanh(h @ torch.from_numpy(mats[i])))
    theirs.backward(torch.from_numpy(dout))
    np.testing.assert_allclose(theirs.detach().numpy(), out, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(tx.grad.numpy(), dh, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(skips.weights.grad.numpy(), dweights, rtol=1e-12)


def test_without_unet_skips_no_block_takes_one():
    cfg = ModelConfig(n_layer=4)
    cache = skips_start({}, cfg)
    x = np.ones(3)
    assert skip_forward(x, 3, cache) is x and cache.keeps == set()
    assert Skips(cfg).weights is None
