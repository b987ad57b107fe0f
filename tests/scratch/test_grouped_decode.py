"""The NumPy engine's decode step under grouped-query attention reads the cached key/value heads
without copying them to every query head (scratch.attention.grouped_decode_forward): the logits
are those of the copying path, one sequence, a left-padded batch, and past the context."""

from __future__ import annotations

import numpy as np
import pytest
from variants import gqa, llama

from sheepop.config.schema import ModelConfig
from sheepop.scratch.attention import attention_core_forward, grouped_decode_forward
from sheepop.scratch.attention import repeat_kv_forward as repeat
from sheepop.scratch.gpt import gpt_forward, new_cache
from sheepop.scratch.init import init_params
from sheepop.scratch.lm import NumpyLM


def config(n_head: int, n_kv_head: int, block_size: int = 12) -> ModelConfig:
    return ModelConfig(vocab_size=17, block_size=block_size, n_layer=2, n_embd=24,
                       **llama(tie_weights=True, **gqa(n_head, n_kv_head)))


@pytest.mark.parametrize("mask_kind", ["none", "rows", "batch"])
def test_the_grouped_product_equals_the_copied_heads(mask_kind):
    rng = np.random.default_rng(0)
    B, H, H_kv, T, dk = 2, 6, 2, 7, 4
    q = rng.standard_normal((B, H, 1, dk))
    k, v = rng.standard_normal((2, B, H_kv, T, dk))
    mask = {"none": None, "rows": np.where(np.arange(T) < 2, -np.inf, 0.0)[None, :],
            "batch": np.where(rng.random((B, 1, 1, T)) < 0.3, -np.inf, 0.0)}[mask_kind]
    ours, _ = grouped_decode_forward(q, k, v, mask)
    reference, _ = attention_core_forward(q, repeat(k, 3), repeat(v, 3), mask=mask)
    if mask is None:  # the causal mask of one query is all zeros: the same as no mask
        assert np.array_equal(reference, attention_core_forward(q, repeat(k, 3), repeat(v, 3))[0])
    np.testing.assert_allclose(ours, reference, rtol=0, atol=1e-13)


@pytest.mark.parametrize(("n_head", "n_kv_head"), [(4, 2), (6, 2), (4, 1)])
def test_decode_steps_give_the_logits_of_a_full_forward(n_head, n_kv_head):
    cfg = config(n_head, n_kv_head)
    params = {n: w.astype(np.float64) for n, w in init_params(cfg, 3).items()}
    ids = np.random.default_rng(1).integers(0, 17, (2, 11))
    full = gpt_forward(params, cfg, ids)[0]
    cache = new_cache(cfg, batch=2, dtype=np.float64)
    gpt_forward(params, cfg, ids[:, :4], cache=cache)
    steps = [gpt_forward(params, cfg, ids[:, t:t + 1], cache=cache, last_only=True)[0][:, 0]
             for t in range(4, 11)]
    np.testing.assert_allclose(np.stack(steps, 1), full[:, 4:], rtol=0, atol=1e-12)


def test_a_left_padded_batch_and_a_rolling_cache_decode_as_each_prompt_alone():
    cfg = config(6, 2, block_size=8)
    lm = NumpyLM(cfg, init_params(cfg, 5), dtype=np.float64)
    prompts = [[1, 2, 3, 4, 5], [6, 7]]
    batch = [lm.prefill_batch(prompts)]
    tokens = [[9, 10], [11, 12], [13, 14], [15, 16], [1, 2], [3, 4]]  # past block_size 8
    batch += [lm.decode_batch(step) for step in tokens]
    for row, prompt in enumerate(prompts):
        alone = [lm.prefill(prompt)] + [lm.decode(step[row]) for step in tokens]
        np.testing.assert_allclose(np.stack([b[row] for b in batch]), np.stack(alone),
                                   rtol=0, atol=1e-10)
