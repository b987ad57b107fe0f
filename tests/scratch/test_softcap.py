"""Logit soft-capping (scratch/softcap.py, model/softcap.py): c tanh(z / c), its backward
gradient-checked, the torch engine's the same numbers, 0 the identity."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scratch_gradcheck import check
from variants import llama

from sheepop.config.schema import ModelConfig
from sheepop.errors import UserError
from sheepop.interop.gpt2 import check_gpt2_shaped
from sheepop.interop.llama import check_llama_shaped
from sheepop.model.softcap import softcap
from sheepop.scratch.softcap import softcap_backward, softcap_forward


def test_values_at_known_points():
    z = np.array([0.0, 2 * np.arctanh(0.5), -2 * np.arctanh(0.9), 1e6])
    y, t = softcap_forward(z, 2.0)
    np.testing.assert_allclose(y, [0.0, 1.0, -1.8, 2.0], rtol=1e-15, atol=1e-15)
    np.testing.assert_allclose(softcap_backward(np.ones(4), t), [1.0, 0.75, 1 - 0.81, 0.0],
                               rtol=1e-14, atol=1e-15)  # 1 - tanh^2: the cap passes nothing


def test_the_backward_is_the_gradient():
    rng = np.random.default_rng(0)
    z = rng.standard_normal((3, 4, 7)) * 4
    y, t = softcap_forward(z, 3.0)
    dy = rng.standard_normal(y.shape)
    check(lambda: softcap_forward(z, 3.0)[0], {"z": z}, {"z": softcap_backward(dy, t)}, dy)


def test_cap_zero_is_the_identity_and_torch_computes_the_same():
    z = np.random.default_rng(1).standard_normal((2, 5)).astype(np.float32) * 20
    same, cache = softcap_forward(z, 0.0)
    assert same is z and cache is None and softcap_backward(z, None) is z
    theirs = softcap(torch.from_numpy(z), 15.0).numpy()
    np.testing.assert_allclose(softcap_forward(z, 15.0)[0], theirs, rtol=0,
                               atol=4 * 2.0 ** -24 * 15)  # a few float32 roundings of c


def test_exports_refuse_capped_logits_by_name():
    with pytest.raises(UserError, match="model.logit_softcap=15 .Llama's logits are not capped"):
        check_llama_shaped(ModelConfig(**llama(), logit_softcap=15.0))
    with pytest.raises(UserError, match="model.logit_softcap=30 .GPT-2's logits are not capped"):
        check_gpt2_shaped(ModelConfig(pos_encoding="learned", activation="gelu_tanh",
                                      logit_softcap=30.0))
