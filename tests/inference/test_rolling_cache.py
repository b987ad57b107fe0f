"""The rolling KV cache past the context (sheepop.arch.kv_cache), in both engines.

A rope model's full cache becomes a ring: each new token overwrites the oldest column and every
query attends over the block_size most recent keys. The reference is sliding-window attention
over the whole sequence (a forward pass on T > block_size), and without a cache the generation
loop recomputes exactly that: the two must agree token for token and logit for logit.
"""

import numpy as np
import pytest
import torch
from variants import gqa, llama

from sheepop.config.model_size import kv_cache_bytes_per_token
from sheepop.config.schema import Config, ModelConfig, SampleConfig
from sheepop.generation.generate import generate, generate_batch_ids
from sheepop.inference.load import build
from sheepop.scratch.gpt import gpt_forward
from sheepop.scratch.init import param_shapes
from sheepop.scratch.lm import NumpyLM

BLOCK, NEW, VOCAB = 8, 40, 23
ROPE = dict(vocab_size=VOCAB, block_size=BLOCK, n_layer=2, n_embd=16, dropout=0.0,
            **llama(**gqa(4, 2)))
GREEDY = SampleConfig(max_new_tokens=NEW, temperature=0.0)


def model_cfg(**kw) -> ModelConfig:
    return ModelConfig(**{**ROPE, **kw})


def weights_for(cfg: ModelConfig, seed: int = 2) -> dict[str, np.ndarray]:
    """Random weights large enough that attention is far from uniform and greedy tokens vary
    (the init rule's N(0, 0.02) makes every position look alike); norm gains near 1."""
    rng = np.random.default_rng(seed)
    return {name: (1.0 + 0.1 * rng.standard_normal(shape) if len(shape) == 1
                   else 0.4 * rng.standard_normal(shape)).astype(np.float32)
            for name, shape in param_shapes(cfg).items()}


def make_lm(engine: str, cfg: ModelConfig, weights=None, dtype=np.float32):
    weights = weights_for(cfg) if weights is None else weights
    if engine == "numpy" and dtype is not np.float32:
        return NumpyLM(cfg, weights, dtype)
    config = Config()
    config.model = cfg
    return build(config, weights, engine=engine).lm


def full_logits(engine: str, lm, ids: list[int]) -> np.ndarray:
    """Logits (T, V) of one forward pass over the whole sequence, without a cache: with
    T > block_size each layer attends over the block_size most recent keys."""
    if engine == "numpy":
        return gpt_forward(lm.params, lm.cfg, np.array([ids]))[0][0]
    with torch.inference_mode():
        return lm.model(torch.tensor([ids]))[0][0].numpy()


def tokens(lm, prompt, use_cache=True, sc=GREEDY, eos_id=None) -> list[int]:
    return [s.token for s in generate(lm, prompt, sc, use_cache=use_cache, eos_id=eos_id)]


@pytest.mark.parametrize("engine", ["torch", "numpy"])
def test_cached_generation_equals_the_uncached_reference_past_the_context(engine):
    lm = make_lm(engine, model_cfg())
    cached = tokens(lm, [1, 2, 3])
    assert lm.slides and lm.cache_length == 3 + NEW - 1 > 4 * BLOCK  # the ring went round
    assert cached == tokens(lm, [1, 2, 3], use_cache=False)
    assert len(cached) == NEW and len(set(cached[BLOCK:])) >= 5  # not stuck on one token


@pytest.mark.parametrize("engine, dtype, tol", [("torch", np.float32, 1e-5),
                                                ("torch-explicit", np.float32, 1e-5),
                                                ("numpy", np.float32, 1e-5),
                                                ("numpy", np.float64, 1e-10)])
def test_every_decode_step_gives_the_logits_of_a_sliding_window_forward(engine, dtype, tol):
    base = engine.split("-")[0]
    lm = make_lm(base, model_cfg(), dtype=dtype)
    if engine == "torch-explicit":
        lm.model.set_attention_path(sdpa=False)  # the masked-softmax path reads the ring too
    ids = list(np.random.default_rng(5).integers(0, VOCAB, 5 * BLOCK))
    steps = [lm.prefill(ids[:1])] + [lm.decode(t) for t in ids[1:]]
    full = full_logits(base, lm, ids)
    assert full.shape == (5 * BLOCK, VOCAB) and np.abs(full).max() > 1.0
    np.testing.assert_allclose(np.stack(steps), full, rtol=0, atol=tol)


@pytest.mark.parametrize("engine", ["torch", "numpy"])
def test_the_full_forward_is_a_sliding_window_of_block_size_keys_per_layer(engine):
    """Through n_layer layers of windows of W keys, position i sees tokens down to
    i - n_layer (W - 1) and none before: an independent check of the reference's mask."""
    lm = make_lm(engine, model_cfg())
    ids = list(np.random.default_rng(6).integers(0, VOCAB, 5 * BLOCK))
    last, reach = len(ids) - 1, 2 * (BLOCK - 1)
    base = full_logits(engine, lm, ids)[last]
    for j, changes in [(last - reach - 1, False), (0, False), (last - reach, True)]:
        edited = ids.copy()
        edited[j] = (edited[j] + 1) % VOCAB
        moved = np.abs(full_logits(engine, lm, edited)[last] - base).max()
        assert (moved > 1e-3) if changes else moved == 0.0, (j, moved)


@pytest.mark.parametrize("engine", ["torch", "numpy"])
def test_a_batch_of_different_lengths_equals_each_prompt_alone_past_the_context(engine):
    lm = make_lm(engine, model_cfg())
    prompts = [[4], [1, 2, 3, 4, 5], list(range(8)), list(range(3, 15))]  # 12 > 8: cropped
    alone = [tokens(lm, p) for p in prompts]
    assert generate_batch_ids(lm, prompts, GREEDY) == alone
    assert len({tuple(a) for a in alone}) == len(prompts)
    # Rows that end at different steps past the context leave the batch (keep_rows on a ring).
    eos = alone[0][3 * BLOCK]
    ended = [tokens(lm, p, eos_id=eos) for p in prompts]
    assert len({len(e) for e in ended}) > 1 and max(len(e) for e in ended) > 2 * BLOCK
    assert generate_batch_ids(lm, prompts, GREEDY, eos_id=eos) == ended


@pytest.mark.parametrize("engine, dtype, itemsize", [("torch", np.float32, 4),
                                                     ("numpy", np.float32, 4),
                                                     ("numpy", np.float64, 8)])
def test_a_gqa_cache_holds_kv_heads_and_its_bytes_per_token_are_the_formula(engine, dtype,
                                                                           itemsize):
    cfg = model_cfg()
    lm = make_lm(engine, cfg, dtype=dtype)
    assert lm.cache.k.shape[3] == 0  # no columns before a token (tests/inference/test_kv_growth)
    lm.prefill([1, 2])  # 2 tokens take a chunk of columns, here the whole context of 8
    assert lm.cache.k.shape == lm.cache.v.shape == (2, 1, 2, BLOCK, 4)  # (L, B, H_kv, T, d_k)
    lm.prefill_batch([[1], [2, 3]])
    assert tuple(lm.batch_cache.k.shape) == (2, 2, 2, BLOCK, 4)
    per_token = kv_cache_bytes_per_token(cfg, itemsize)
    assert per_token == 2 * 2 * 2 * 4 * itemsize  # K and V, 2 layers, 2 heads of 4
    nbytes = sum(np.asarray(b).nbytes if engine == "numpy" else b.numel() * b.element_size()
                 for b in (lm.cache.k, lm.cache.v))
    assert nbytes == per_token * lm.cache.max_len
    assert kv_cache_bytes_per_token(model_cfg(n_kv_head=0), itemsize) == 2 * per_token


@pytest.mark.parametrize("engine", ["torch", "numpy"])
def test_absolute_positions_do_not_roll_but_refill_a_sliding_window(engine):
    lm = make_lm(engine, model_cfg(pos_encoding="sinusoidal"))
    cached = tokens(lm, [1, 2, 3])  # (the chunks of the slide: tests/inference/test_past_context)
    assert not lm.slides and lm.cache_length <= BLOCK
    assert cached == tokens(lm, [1, 2, 3], use_cache=False)
    assert len(set(cached[BLOCK:])) >= 3


@pytest.mark.parametrize("engine", ["torch", "numpy"])
def test_learned_positions_refuse_a_sequence_past_block_size_and_rope_takes_it(engine):
    learned = make_lm(engine, model_cfg(pos_encoding="learned"))
    ids = list(range(BLOCK + 1))
    with pytest.raises(ValueError, match=f"sequence of {BLOCK + 1} tokens exceeds block_size"):
        full_logits(engine, learned, ids)
    learned.prefill(ids[:BLOCK])
    with pytest.raises(ValueError, match=f"sequence of {BLOCK + 1} tokens exceeds"):
        learned.decode(1)  # a full cache without rotary positions does not roll
    rope = make_lm(engine, model_cfg())
    assert full_logits(engine, rope, ids).shape == (BLOCK + 1, VOCAB)
