"""Absolute positions past the context: the window slides by a chunk (sheepop.generation.generate).

With T = block_size and C = the chunk, the step that follows n tokens sees ids[s(n):n], with
s(n) = 0 while n <= T and C * ceil((n - T) / C) past it: the cache is refilled once per C tokens.
The uncached loop (`use_cache=False`) computes the same windows and is the reference; C = 1 is
the old "always the last T tokens".
"""

import dataclasses

import numpy as np
import pytest

from sheepop.config.schema import Config, ModelConfig, SampleConfig
from sheepop.errors import UserError
from sheepop.generation.generate import generate, generate_batch, slide_chunk, window_start
from sheepop.inference.load import build
from sheepop.scratch.init import param_shapes

BLOCK, NEW, VOCAB = 8, 44, 23
LEARNED = dict(vocab_size=VOCAB, block_size=BLOCK, n_layer=2, n_head=2, n_embd=16,
               pos_encoding="learned", dropout=0.0)
PROMPTS = [[5, 9, 2, 7, 7, 1, 30 % VOCAB], [3], [11, 4]]


def greedy(chunk: int, new: int = NEW, penalty: float = 1.0) -> SampleConfig:
    return SampleConfig(max_new_tokens=new, temperature=0.0, slide_chunk=chunk,
                        repetition_penalty=penalty)


def make_lm(engine: str, pos_encoding: str = "learned", seed: int = 3):
    """A tiny model with random weights large enough that attention is far from uniform."""
    cfg = ModelConfig(**{**LEARNED, "pos_encoding": pos_encoding})
    rng = np.random.default_rng(seed)
    weights = {name: (1.0 + 0.1 * rng.standard_normal(shape) if len(shape) == 1
                      else rng.standard_normal(shape)).astype(np.float32)
               for name, shape in param_shapes(cfg).items()}
    config = Config()
    config.model = cfg
    return build(config, weights, engine=engine).lm


def tokens(lm, prompt, sc, use_cache=True) -> list[int]:
    return [s.token for s in generate(lm, prompt, sc, use_cache=use_cache)]


class Recorder:
    """A fake LanguageModel: records what it is given; its next token is the last one + 1, so
    the sequence is 1, 2, 3, ... and every window reads as a range."""

    block_size, slides, never_generate = 4, False, ()

    def __init__(self):
        self.calls: list[tuple[str, list[int]]] = []
        self.cached: list[int] = []

    def _next(self, last: int) -> np.ndarray:
        logits = np.zeros(100)
        logits[last + 1] = 1.0
        return logits

    def prefill(self, ids):
        self.calls.append(("prefill", list(ids)))
        self.cached = list(ids)
        return self._next(ids[-1])

    def decode(self, token):
        assert len(self.cached) < self.block_size, "decode into a full cache"
        self.calls.append(("decode", [token]))
        self.cached.append(token)
        return self._next(token)

    def full(self, ids):
        self.calls.append(("full", list(ids)))
        return self._next(ids[-1])

    @property
    def cache_length(self) -> int:
        return len(self.cached)


def test_each_step_sees_the_window_of_its_chunk():
    lm = Recorder()  # T = 4, chunk 2: 5 tokens make the window drop 2 of them
    assert tokens(lm, [1], greedy(2, new=9)) == [2, 3, 4, 5, 6, 7, 8, 9, 10]
    assert lm.calls == [("prefill", [1]), ("decode", [2]), ("decode", [3]), ("decode", [4]),
                        ("prefill", [3, 4, 5]), ("decode", [6]),
                        ("prefill", [5, 6, 7]), ("decode", [8]),
                        ("prefill", [7, 8, 9])]
    lm.calls = []
    tokens(lm, [1], greedy(2, new=9), use_cache=False)
    assert lm.calls == [("full", [1]), ("full", [1, 2]), ("full", [1, 2, 3]),
                        ("full", [1, 2, 3, 4]), ("full", [3, 4, 5]), ("full", [3, 4, 5, 6]),
                        ("full", [5, 6, 7]), ("full", [5, 6, 7, 8]), ("full", [7, 8, 9])]


def test_chunk_one_is_always_the_last_block_size_tokens_and_a_long_prompt_is_cropped():
    lm = Recorder()
    tokens(lm, [9, 1, 2, 3, 4], greedy(1, new=4))
    assert lm.calls == [("prefill", [1, 2, 3, 4]), ("prefill", [2, 3, 4, 5]),
                        ("prefill", [3, 4, 5, 6]), ("prefill", [4, 5, 6, 7])]
    lm.calls = []  # a chunk of the whole context keeps only the newest token
    tokens(lm, [1, 2, 3, 4], greedy(4, new=3))
    assert lm.calls == [("prefill", [1, 2, 3, 4]), ("prefill", [5]), ("decode", [6])]


def test_the_window_start_and_the_chunk_by_formula():
    T, C = 8, 3
    assert [window_start(n, T, C) for n in range(1, 18)] == \
        [0] * 8 + [3, 3, 3, 6, 6, 6, 9, 9, 9]
    assert all(1 <= n - window_start(n, T, c) <= T and n - window_start(n, T, c) > T - c
               for c in (1, 2, 5, 8) for n in range(T + 1, 60))
    assert slide_chunk(SampleConfig(), 256) == 64  # the default: a quarter of the context
    assert slide_chunk(SampleConfig(slide_chunk=1), 256) == 1
    assert slide_chunk(SampleConfig(slide_chunk=999), 256) == 256
    assert slide_chunk(SampleConfig(), 3) == 1
    bad = Config()
    bad.sample = dataclasses.replace(bad.sample, slide_chunk=-1)
    with pytest.raises(UserError, match="sample.slide_chunk must be >= 0"):
        bad.validate()


@pytest.mark.parametrize("engine", ["torch", "numpy"])
@pytest.mark.parametrize("pos, seed", [("learned", 3), ("sinusoidal", 6)])
def test_cached_generation_equals_the_uncached_reference_over_several_chunks(engine, pos, seed):
    lm = make_lm(engine, pos, seed)
    outputs = {}  # greedy, with a repetition penalty that keeps a random model off one loop
    for chunk in (1, 3, 0):  # 0: the default, BLOCK // 4 = 2
        cached = tokens(lm, [1, 2, 3], greedy(chunk, penalty=1.5))
        assert cached == tokens(lm, [1, 2, 3], greedy(chunk, penalty=1.5), use_cache=False)
        outputs[chunk] = cached
    assert len(set(outputs[3][BLOCK:])) >= 4  # well past the context, not stuck on one token
    assert outputs[1] != outputs[3]  # the chunk changes what the model sees
    # Chunk 1 is the old semantics: the penalized argmax after the last BLOCK tokens.
    ids = [1, 2, 3]
    for _ in range(NEW):
        logits = lm.full(ids[-BLOCK:])
        logits[list(lm.never_generate)] = -np.inf
        seen = np.isin(np.arange(VOCAB), ids)
        logits[seen] = np.where(logits[seen] > 0, logits[seen] / 1.5, logits[seen] * 1.5)
        ids.append(int(np.argmax(logits)))
    assert outputs[1] == ids[3:]


@pytest.mark.parametrize("engine", ["torch", "numpy"])
@pytest.mark.parametrize("use_cache", [True, False])
def test_a_batch_slides_each_row_on_its_own_schedule_as_alone(engine, use_cache):
    lm = make_lm(engine)
    sc = greedy(3)
    alone = [tokens(lm, p, sc) for p in PROMPTS]
    steps = generate_batch(lm, PROMPTS, sc, use_cache=use_cache)
    got: list[list[int]] = [[] for _ in PROMPTS]
    out = next(steps)
    try:
        for n in range(NEW):
            for b, token in enumerate(out):
                if token is not None:
                    got[b].append(token)
            # The longest row leaves after 5 tokens: the others keep its padding columns, so
            # the cache fills before their own windows slide.
            out = steps.send({0}) if n == 4 else next(steps)
    except StopIteration:
        pass
    assert got[0] == alone[0][:5]
    assert got[1:] == alone[1:]
