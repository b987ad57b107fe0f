"""SmolLM2-135M's KV cache grows with its tokens, not with its context of 8,192 (issue 27).

One position of SmolLM2 holds 2 (K, V) x 30 layers x 3 key/value heads x 64 x 4 bytes = 46,080
bytes in float32, so a cache preallocated to the context held 377,487,360 bytes (360 MiB) for
one sequence before its first token. Here 140 generated tokens hold 256 positions (11.2 MiB),
and the logits across a growth are those of a preallocated cache, bit for bit, in both engines.
"""

import numpy as np
import pytest
import torch

from sheepop.arch.kv_cache import KVCache, cache_shape, describe_memory
from sheepop.config.schema import SampleConfig
from sheepop.generation.generate import generate
from sheepop.inference.load import load

pytestmark = [pytest.mark.real_model, pytest.mark.usefixtures("one_torch_thread")]

PER_POSITION = 2 * 30 * 3 * 64 * 4


def test_140_tokens_of_smollm2_hold_256_positions_not_8192(smollm2_run, capsys):
    model = load(smollm2_run, engine="torch", device="cpu")
    lm, ids = model.lm, model.tokenizer.encode("The capital of France is")
    sc = SampleConfig(max_new_tokens=140, temperature=0.8, seed=0)
    tokens = [s.token for s in generate(lm, ids, sc)]  # no eos_id: all 140 tokens
    cache = lm.cache
    assert len(tokens) == 140 and cache.length == len(ids) + 139 and cache.max_len == 8192
    assert cache.capacity == 256 and cache.nbytes == 256 * PER_POSITION == 11_796_480
    assert cache.peak_bytes == (128 + 256) * PER_POSITION  # the last growth's copy
    line = describe_memory(cache)
    assert line == ("KV cache: 256 of 8,192 positions allocated, 11.2 MiB (peak 16.9 MiB; the "
                    "whole context: 360.0 MiB)")
    with capsys.disabled():
        print(f"\nSmolLM2, {len(ids)} prompt tokens + 140 generated: {line}")


@pytest.mark.parametrize("engine", ["torch", "numpy"])
def test_smollm2_logits_across_a_growth_equal_a_preallocated_cache(smollm2_run, engine):
    model = load(smollm2_run, engine=engine, device="cpu")
    lm, cfg = model.lm, model.config.model
    ids = model.tokenizer.encode("Paris is the capital and largest city of France. " * 12)[:72]
    assert len(ids) == 72

    def steps(cache: KVCache) -> np.ndarray:
        lm.cache = cache
        return np.stack([lm.prefill(ids[:60])] + [lm.decode(t) for t in ids[60:]])

    growing = steps(lm._new_cache(1))
    assert lm.cache.capacity == 128  # 60 tokens in 64 columns, then the 65th doubles them
    shape = cache_shape(cfg, 1)
    zeros = (lambda: np.zeros(shape, np.float32)) if engine == "numpy" else (
        lambda: torch.zeros(shape))
    fixed = steps(KVCache(zeros(), zeros(), rolling=True))
    assert np.array_equal(growing, fixed)
