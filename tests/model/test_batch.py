"""Batched generation with left padding in the torch engine (TorchLM): every prompt gets what
it gets alone. The padding rules themselves are tested in tests/arch/."""

import numpy as np
import pytest
import torch

from sheepop.config.schema import ModelConfig, SampleConfig
from sheepop.generation.generate import generate, generate_batch, generate_batch_ids
from sheepop.model import GPT, TorchLM

PROMPTS = [[3], [5, 9, 2, 7, 7, 1, 30], [11, 4], [8, 8, 8, 8, 8]]


def alone(lm, prompt, cfg, **kw):
    return [s.token for s in generate(lm, prompt, cfg, **kw)]


@pytest.mark.parametrize("overrides", [{}, {"pos_encoding": "learned"}])
def test_padded_logits_equal_each_prompt_alone(small_cfg, overrides):
    cfg = ModelConfig(**{**small_cfg.__dict__, **overrides})
    torch.manual_seed(1)
    lm = TorchLM(GPT(cfg))
    batch = lm.prefill_batch(PROMPTS)
    uncached = lm.full_batch(PROMPTS)
    for b, prompt in enumerate(PROMPTS):
        solo = lm.full(prompt)
        assert np.allclose(batch[b], solo, atol=1e-5, rtol=0)
        assert np.allclose(uncached[b], solo, atol=1e-5, rtol=0)
    # Three decode steps through the padded cache, against full recomputation of each row.
    rows = [list(p) for p in PROMPTS]
    for t in range(3):
        tokens = [(7 * b + t) % cfg.vocab_size for b in range(len(rows))]
        out = lm.decode_batch(tokens)
        for b, row in enumerate(rows):
            row.append(tokens[b])
            assert np.allclose(out[b], lm.full(row), atol=1e-5, rtol=0)


@pytest.mark.parametrize("sc", [
    SampleConfig(max_new_tokens=40, temperature=0),
    SampleConfig(max_new_tokens=40, temperature=1.0, top_k=8, seed=5),
    SampleConfig(max_new_tokens=40, temperature=0.9, top_p=0.9, repetition_penalty=1.3, seed=9),
])
def test_batch_gives_the_same_tokens_as_each_prompt_alone(small_lm, sc):
    # block_size 32 and up to 47 tokens per row: the windows slide inside the batch too.
    batch = generate_batch_ids(small_lm, PROMPTS, sc)
    for prompt, tokens in zip(PROMPTS, batch):
        assert tokens == alone(small_lm, prompt, sc)
    assert generate_batch_ids(small_lm, PROMPTS, sc, use_cache=False) == batch


def test_rows_that_end_leave_the_batch_and_the_rest_go_on(small_lm):
    sc = SampleConfig(max_new_tokens=30, temperature=1.0, seed=3)
    free = [alone(small_lm, p, sc) for p in PROMPTS]
    # An "eos" that prompt 1 draws and some other prompt never does.
    eos = next(t for t in free[1] if any(t not in other for other in free))
    expected = []
    for tokens in free:
        cut = tokens.index(eos) + 1 if eos in tokens else len(tokens)
        expected.append(tokens[:cut])
    assert generate_batch_ids(small_lm, PROMPTS, sc, eos_id=eos) == expected
    assert len(expected[1]) < 30 and any(len(e) == 30 for e in expected)


def test_sending_indices_ends_those_prompts(small_lm):
    sc = SampleConfig(max_new_tokens=10, temperature=0)
    steps = generate_batch(small_lm, PROMPTS, sc)
    first = next(steps)
    second = steps.send({0, 2})
    assert all(t is not None for t in first)
    assert second[0] is None and second[2] is None
    rest = list(steps)
    assert len(rest) == 8 and all(s[0] is None and s[1] is not None for s in rest)
    solo = alone(small_lm, PROMPTS[1], sc)
    assert [first[1], second[1]] + [s[1] for s in rest] == solo


def test_seeds_give_each_row_its_own_draws(small_lm):
    sc = SampleConfig(max_new_tokens=20, temperature=1.0)
    same = generate_batch_ids(small_lm, [[1, 2], [1, 2]], sc)
    assert same[0] == same[1]
    seeded = generate_batch_ids(small_lm, [[1, 2], [1, 2]], sc, seeds=[1, 2])
    assert seeded[0] == alone(small_lm, [1, 2],
                              SampleConfig(max_new_tokens=20, temperature=1.0, seed=1))
    assert seeded[1] == alone(small_lm, [1, 2],
                              SampleConfig(max_new_tokens=20, temperature=1.0, seed=2))
    assert seeded[0] != seeded[1]


def test_bfloat16_cast_keeps_the_logits_close(small_lm):
    reference = [small_lm.full(p) for p in PROMPTS]
    small_lm.cast(torch.bfloat16)
    assert small_lm.model.tok_emb.weight.dtype == torch.bfloat16
    assert small_lm.cache.k.dtype == torch.bfloat16
    batch = small_lm.prefill_batch(PROMPTS)
    assert batch.dtype == np.float32
    scale = max(np.abs(r).max() for r in reference)
    for b, ref in enumerate(reference):
        assert np.abs(batch[b] - ref).max() < 0.02 * scale  # bf16 keeps ~3 significant digits
        assert np.abs(small_lm.prefill(PROMPTS[b]) - ref).max() < 0.02 * scale
