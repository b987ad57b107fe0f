"""Prompt reuse and chunked prefill without HTTP (sheepop.generation.prefix_cache, prefill,
cached_lm.prefill): keys and values copied from earlier requests, or computed a chunk at a
time, give the logits and tokens of a prompt computed whole, in both engines; the cache stays
within its bound and recomputes what it evicted."""

from __future__ import annotations

import numpy as np
import pytest
from nan_memory import nan_memory
from serve_helpers import random_tokens, tiny_lm

from sheepop.generation.prefill import Prefill, prefill_together
from sheepop.generation.prefix_cache import BLOCK_TOKENS, PrefixCache
from sheepop.generation.running_batch import RunningBatch

CONTEXT = 96
# float32 logits of O(10) through 2 layers, in passes of other sizes (sums in another order):
# a few ulps of the largest activation, ~1e-6 relative, well inside 2e-4 (as
# tests/serve/test_running_batch.py); a wrong key or position moves them by O(1).
ATOL = {"torch": 2e-4, "numpy": 2e-4}


def _whole(lm, prompt) -> np.ndarray:
    """The reference: the prompt prefilled in one fresh cache, no reuse."""
    p = Prefill(lm, prompt)
    p.advance(len(prompt))
    return p.logits


@pytest.mark.parametrize("engine", ["torch", "numpy"])
@pytest.mark.parametrize("pos", ["rope", "sinusoidal"])
def test_a_prompt_from_cached_blocks_gets_the_logits_of_the_whole_prompt(engine, pos):
    lm = tiny_lm(engine, CONTEXT, pos)
    prefix = PrefixCache(1 << 30)
    system = random_tokens(0, 40)  # 2 whole blocks and 8 tokens
    first = Prefill(lm, system + random_tokens(1, 10), prefix)
    assert first.cached == 0
    first.advance(100)
    for seed in (2, 3):
        prompt = system + random_tokens(seed, 21)
        p = Prefill(lm, prompt, prefix)
        assert p.cached == 2 * BLOCK_TOKENS  # the shared system prompt's whole blocks
        p.advance(100)
        np.testing.assert_allclose(p.logits, _whole(lm, prompt), atol=ATOL[engine])
    # a prompt that is all cached blocks still computes its last token: one block less
    again = Prefill(lm, (system + random_tokens(1, 10))[:48], prefix)
    assert again.cached == 2 * BLOCK_TOKENS


@pytest.mark.parametrize("engine", ["torch", "numpy"])
@pytest.mark.parametrize("memory", ["zeros", "nan"])
def test_chunked_prefill_gives_the_logits_and_tokens_of_a_whole_prefill(engine, memory,
                                                                       monkeypatch):
    """`nan`: every cache's fresh memory holds NaN (a prefill's own columns are left unzeroed
    for its chunks to write): nothing reads a column before it is written or zeroed."""
    if memory == "nan":
        nan_memory(monkeypatch)
    lm = tiny_lm(engine, CONTEXT)
    prompt = random_tokens(4, 70)
    whole = _whole(lm, prompt)
    for chunk in (1, 7, 16, 69):
        p = Prefill(lm, prompt)
        steps = 0
        while not p.finished:
            p.advance(chunk)
            steps += 1
        assert steps == -(-70 // chunk)
        np.testing.assert_allclose(p.logits, whole, atol=ATOL[engine])
        # and the greedy continuation from its cache, in a running batch, is the same
        a, b = RunningBatch(lm, 2), RunningBatch(lm, 2)
        a.place(p)
        z_b = b.join([prompt])[0]
        tok_a = tok_b = int(np.argmax(whole))
        assert int(np.argmax(z_b)) == tok_a
        for _ in range(10):
            za, zb = a.step([tok_a])[0], b.step([tok_b])[0]
            np.testing.assert_allclose(za, zb, atol=ATOL[engine])
            tok_a, tok_b = int(np.argmax(za)), int(np.argmax(zb))
            assert tok_a == tok_b


@pytest.mark.parametrize("engine", ["torch", "numpy"])
def test_eviction_keeps_within_the_bound_and_recomputes_what_it_dropped(engine):
    lm = tiny_lm(engine, CONTEXT)
    p = Prefill(lm, random_tokens(5, 33))
    p.advance(33)
    block_bytes = 2 * p.cache.k[:, 0, :, :BLOCK_TOKENS].nbytes
    prefix = PrefixCache(3 * block_bytes)  # three blocks
    prompts = [random_tokens(10 + i, 2 * BLOCK_TOKENS + 5) for i in range(3)]
    for prompt in prompts:
        Prefill(lm, prompt, prefix).advance(100)
        assert prefix.nbytes <= prefix.max_bytes
    assert len(prefix.blocks) == 3 and prefix.evicted == 3
    # the last prompt's 2 blocks and the second's first (a prefix outlives its extension)
    assert Prefill(lm, prompts[2], prefix).cached == 2 * BLOCK_TOKENS
    assert Prefill(lm, prompts[1], prefix).cached == BLOCK_TOKENS
    evicted = Prefill(lm, prompts[0], prefix)
    assert evicted.cached == 0
    evicted.advance(100)
    np.testing.assert_allclose(evicted.logits, _whole(lm, prompts[0]), atol=ATOL[engine])


def test_a_model_with_digit_places_is_never_served_from_the_cache():
    """(the run of digits at a block's end is not kept: reusing keys without it would give
    other positions to the tokens after)"""
    lm = tiny_lm("numpy", CONTEXT, "learned", digits=6)
    prefix = PrefixCache(1 << 30)
    prompt = random_tokens(6, 40)
    Prefill(lm, prompt, prefix).advance(100)
    assert not prefix.usable and prefix.nbytes == 0
    assert Prefill(lm, prompt, prefix).cached == 0


@pytest.mark.parametrize("engine", ["torch", "numpy"])
def test_the_next_turn_keeps_the_cached_conversation(engine):
    """`CachedLM.prefill` (sheepop chat's turns) keeps the tokens its cache holds that begin
    the new prompt, and its logits are those of a fresh cache."""
    lm = tiny_lm(engine, CONTEXT)
    turn1 = random_tokens(7, 30)
    lm.prefill(turn1)
    answer = random_tokens(8, 6)
    for t in answer:
        lm.decode(t)
    turn2 = turn1 + answer + random_tokens(9, 12)
    z = lm.prefill(turn2)
    assert lm.reused == 36
    np.testing.assert_allclose(z, tiny_lm(engine, CONTEXT).prefill(turn2), atol=ATOL[engine])
    edited = turn2[:10] + [39] + turn2[11:]  # a change at token 10: only 10 are kept
    np.testing.assert_allclose(lm.prefill(edited), tiny_lm(engine, CONTEXT).prefill(edited),
                               atol=ATOL[engine])
    assert lm.reused == 10


@pytest.mark.parametrize("engine", ["torch", "numpy"])
@pytest.mark.parametrize("pos, digits", [("rope", 0), ("learned", 6)])
def test_prompts_prefilled_together_continue_as_each_alone(engine, pos, digits):
    """(digit places: each row's run of digits goes with its own cache)"""
    lm = tiny_lm(engine, CONTEXT, pos, digits)
    # each ending in its own run of digits (ids below 10 of the digits tokenizer)
    tails = [[1, 2, 3], [], [4], [5, 6]]
    prompts = [random_tokens(20 + i, n) + [11] + tail
               for i, (n, tail) in enumerate(zip([5, 23, 17, 1], tails))]
    together = [Prefill(lm, p) for p in prompts]
    prefill_together(together)
    joined, alone = RunningBatch(lm, 4), RunningBatch(lm, 4)
    for p, prompt in zip(together, prompts):
        assert p.finished and p.cache.length == len(prompt)
        np.testing.assert_allclose(p.logits, _whole(lm, prompt), atol=ATOL[engine])
        joined.place(p)
        alone.join([prompt])
    tokens = [int(np.argmax(p.logits)) for p in together]
    for _ in range(8):
        a, b = joined.step(tokens), alone.step(tokens)
        np.testing.assert_allclose(a, b, atol=ATOL[engine])
        tokens = [int(t) for t in a.argmax(-1)]
        assert tokens == [int(t) for t in b.argmax(-1)]
