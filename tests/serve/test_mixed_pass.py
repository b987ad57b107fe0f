"""A running batch's decode step and the chunks of prompts joining it in one forward pass
(sheepop.arch.packed, `CachedLM.mixed`, `RunningBatch.step` with chunks): every row's logits and
every prompt's are those of the separate passes, within float32's rounding, in both engines, with
rotary and absolute positions, grouped-query attention, padded and unpadded batches, prompts
from the prefix cache, rows steered each their own way; the mixed prompts then continue as if
prefilled whole; a model with digit places is never mixed."""

from __future__ import annotations

import numpy as np
import pytest
from serve_helpers import random_tokens, tiny_lm
from variants import gqa

from sheepop.generation.prefill import Prefill
from sheepop.generation.prefix_cache import PrefixCache
from sheepop.generation.running_batch import RunningBatch
from sheepop.generation.steering import Steering, SteeringVector

CONTEXT = 96
# Logits of O(10) through 2 layers of width 32: the mixed pass multiplies the same numbers in
# products of another width, which sum in another order, so the logits move by a few ulps of the
# largest activation (measured: under 3e-7 in both engines); a key in the wrong cache, a wrong
# position or mask moves them by O(1).
ATOL = 1e-5


def _lm(engine: str, pos: str = "rope", digits: int = 0):
    """The tiny model with grouped-query attention: 4 query heads on 2 key/value heads."""
    return tiny_lm(engine, CONTEXT, pos, digits, **gqa(4, 2))


@pytest.mark.parametrize("engine", ["torch", "numpy"])
@pytest.mark.parametrize("pos", ["rope", "sinusoidal"])
@pytest.mark.parametrize("lengths", [(5, 9, 3), (6, 6)], ids=["padded", "unpadded"])
def test_a_step_and_chunks_in_one_pass_equal_the_separate_passes(engine, pos, lengths):
    lm = _lm(engine, pos)
    assert lm.mixes
    running = [random_tokens(i, n) for i, n in enumerate(lengths)]
    prompts = [random_tokens(10, 50), random_tokens(11, 20)]  # chunks of 7: 8 and 3 iterations
    mixed, apart = RunningBatch(lm, 8), RunningBatch(lm, 8)
    mixed.join(running)
    apart.join(running)
    pm, pa = [Prefill(lm, p) for p in prompts], [Prefill(lm, p) for p in prompts]
    tokens = [1] * len(running)
    for _ in range(9):
        z_mixed = mixed.step(tokens, [(p, 7) for p in pm if not p.finished])
        for p in pa:
            if not p.finished:
                p.advance(7)
        z_apart = apart.step(tokens)
        np.testing.assert_allclose(z_mixed, z_apart, atol=ATOL)
        for a, b in zip(pm, pa):
            assert a.done == b.done and a.cache.length == b.cache.length == a.done
        tokens = [int(t) for t in z_apart.argmax(-1)]
    for a, b, prompt in zip(pm, pa, prompts):
        assert a.finished
        np.testing.assert_allclose(a.logits, b.logits, atol=ATOL)
        whole = Prefill(lm, prompt)
        whole.advance(len(prompt))
        np.testing.assert_allclose(a.logits, whole.logits, atol=ATOL)
    # the prompts mixed in join the batch and decode as those prefilled apart do
    for a, b in zip(pm, pa):
        mixed.place(a)
        apart.place(b)
    tokens += [int(np.argmax(p.logits)) for p in pa]
    for _ in range(6):
        z_mixed, z_apart = mixed.step(tokens), apart.step(tokens)
        np.testing.assert_allclose(z_mixed, z_apart, atol=ATOL)
        tokens = [int(t) for t in z_apart.argmax(-1)]
        assert tokens == [int(t) for t in z_mixed.argmax(-1)]


@pytest.mark.parametrize("engine", ["torch", "numpy"])
def test_a_prompt_from_cached_blocks_mixes_in_from_where_the_cache_ends(engine):
    lm = _lm(engine, "learned")
    prefix = PrefixCache(1 << 30)
    system = random_tokens(20, 40)  # 2 whole blocks and 8 tokens
    first = Prefill(lm, system + random_tokens(21, 5), prefix)
    first.advance(100)
    prompt = system + random_tokens(22, 17)
    p = Prefill(lm, prompt, prefix)
    assert p.cached == 32
    batch = RunningBatch(lm, 4)
    z = batch.join([random_tokens(23, 4)])
    batch.step([int(np.argmax(z[0]))], [(p, 100)])  # the 25 tokens left, with the step
    whole = Prefill(lm, prompt)
    whole.advance(len(prompt))
    assert p.finished
    np.testing.assert_allclose(p.logits, whole.logits, atol=ATOL)


@pytest.mark.parametrize("engine", ["torch", "numpy"])
def test_each_row_of_a_mixed_pass_is_steered_its_own_way(engine):
    lm = _lm(engine)
    assert lm.mixes and not _lm(engine, "learned", digits=6).mixes  # (digits: each row's run)

    def steering(seed: int, strength: float) -> Steering:
        v = np.random.default_rng(seed).normal(size=32).astype(np.float32)
        return Steering(((SteeringVector(v, 1, "m", 2), strength),))

    up, down = steering(1, 4.0), steering(2, -3.0)
    running, prompt = [random_tokens(30, 5), random_tokens(31, 8)], random_tokens(32, 20)
    mixed, apart = RunningBatch(lm, 4), RunningBatch(lm, 4)
    with lm.steered_rows([up, None]):
        mixed.join(running)
        apart.join(running)
    pm, pa = Prefill(lm, prompt, steering=down), Prefill(lm, prompt, steering=down)
    tokens = [1, 2]
    while not pm.finished:
        with lm.steered_rows([up, None, down]):  # the step's rows, then the chunk's
            z_mixed = mixed.step(tokens, [(pm, 7)])
        pa.advance(7)  # (under its own steering)
        with lm.steered_rows([up, None]):
            z_apart = apart.step(tokens)
        np.testing.assert_allclose(z_mixed, z_apart, atol=ATOL)
        tokens = [int(t) for t in z_apart.argmax(-1)]
    np.testing.assert_allclose(pm.logits, pa.logits, atol=ATOL)
    plain = Prefill(lm, prompt)
    plain.advance(len(prompt))
    assert np.abs(plain.logits - pa.logits).max() > 0.1  # (the steering is felt)
