"""A KV cache that grows with the tokens, not with the context (sheepop.arch.kv_cache, issue 27).

A model with a context of 8,192 positions (tiny width, so it is fast) must not allocate 8,192
columns for a short generation: a cache starts empty, takes the prompt rounded up to 64 columns
and doubles when full, at most up to the context. Growing copies the filled columns into a new
buffer, which changes no number: every logit below is compared bit for bit (np.array_equal)
with a cache preallocated to the whole context, as every cache was before, in both engines,
for rotary, learned and sinusoidal positions, past the context too (the ring and the window
refill), and for the server's running batch, whose memory follows the rows and tokens in flight.
"""

import numpy as np
import pytest
import torch
from nan_memory import nan_memory
from variants import ROPE, gqa

from sheepop.arch.kv_cache import KVCache, cache_shape, describe_memory, grown, shrunk, slides
from sheepop.config.model_size import kv_cache_bytes_per_token
from sheepop.config.schema import Config, ModelConfig, SampleConfig
from sheepop.generation.generate import generate, generate_batch_ids
from sheepop.generation.running_batch import RunningBatch
from sheepop.inference.load import build
from sheepop.scratch.init import param_shapes

CONTEXT, VOCAB = 8192, 31
SHAPE = dict(vocab_size=VOCAB, n_layer=2, n_embd=16, bias=False, tie_weights=False, dropout=0.0,
             **gqa(4, 2))
PER_TOKEN = 2 * 2 * 2 * 4 * 4  # K and V, 2 layers, 2 kv heads of 4, float32: 128 bytes


def model_cfg(pos: str = "rope", block_size: int = CONTEXT) -> ModelConfig:
    return ModelConfig(**SHAPE, block_size=block_size, pos_encoding=pos)


def random_weights(cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Weights large enough that attention is far from uniform and greedy tokens vary."""
    rng = np.random.default_rng(3)
    return {name: (1.0 + 0.1 * rng.standard_normal(shape) if len(shape) == 1
                   else 0.4 * rng.standard_normal(shape)).astype(np.float32)
            for name, shape in param_shapes(cfg).items()}


def make_model(engine: str, cfg: ModelConfig):
    config = Config()
    config.model = cfg
    return build(config, random_weights(cfg), engine=engine)


def make_lm(engine: str, cfg: ModelConfig):
    return make_model(engine, cfg).lm


def preallocated(engine: str, cfg: ModelConfig, batch: int = 1) -> KVCache:
    """A cache of the whole context, allocated at once and never grown: every cache before."""
    shape = cache_shape(cfg, batch)
    zeros = np.zeros if engine == "numpy" else torch.zeros
    return KVCache(zeros(shape, dtype=np.float32 if engine == "numpy" else torch.float32),
                   zeros(shape, dtype=np.float32 if engine == "numpy" else torch.float32),
                   slides(cfg))


def greedy(lm, prompt, n: int) -> list[int]:
    sc = SampleConfig(max_new_tokens=n, temperature=0.0)
    return [s.token for s in generate(lm, prompt, sc)]


def test_growth_doubles_from_a_chunk_up_to_the_limit_and_shrinks_at_four_times():
    assert grown(0, 5, CONTEXT) == 64 and grown(64, 64, CONTEXT) == 64
    assert [grown(c, c + 1, CONTEXT) for c in (64, 128, 1024, 4096)] == [128, 256, 2048, 8192]
    assert grown(0, 130, CONTEXT) == 192 and grown(64, 300, CONTEXT) == 320  # chunk, or 2x
    assert grown(0, 5, 8) == 8 and grown(4096, 6000, 6000) == 6000  # never past the limit
    assert grown(3, 4, 16, chunk=1) == 6  # rows: chunks of one
    assert shrunk(2048, 0, CONTEXT) == 0 and shrunk(2048, 600, CONTEXT) == 2048
    assert shrunk(2048, 500, CONTEXT) == 1024 and shrunk(256, 10, CONTEXT) == 64
    assert shrunk(192, 10, CONTEXT) == 192  # less than 4 chunks: kept
    assert shrunk(16, 4, 16, chunk=1) == 8 and shrunk(16, 5, 16, chunk=1) == 16


def test_make_room_grows_before_a_forward_pass_and_leaves_a_ring_or_an_overflow_to_update():
    """(torch grows the cache before its forward pass, which torch.compile may trace)"""
    cache = make_lm("numpy", model_cfg(block_size=100))._new_cache(2)
    cache.make_room(5)
    assert (cache.batch, cache.capacity, cache.nbytes) == (2, 64, 2 * 64 * PER_TOKEN)
    cache.length = 90
    cache.make_room(10)
    assert cache.capacity == 100 and cache.peak_bytes == 2 * (64 + 100) * PER_TOKEN
    cache.length = 250  # a full ring: the next token overwrites a column, nothing grows
    cache.make_room(1)
    cache.length = 0
    cache.make_room(101)  # more than the context: update refuses it, not make_room
    assert cache.capacity == 100
    with pytest.raises(ValueError, match="KV cache full: 101 positions > capacity 100"):
        cache.reserve(101)


@pytest.mark.parametrize("engine", ["torch", "numpy"])
def test_the_capacity_follows_the_tokens_not_the_context_of_8192(engine):
    lm = make_lm(engine, model_cfg())
    assert lm.cache.capacity == 0 and lm.cache.nbytes == 0  # nothing before the first token
    greedy(lm, [1, 2, 3, 4, 5], 20)
    assert (lm.cache.length, lm.cache.capacity) == (24, 64)
    assert lm.cache.nbytes == 64 * PER_TOKEN == 8192  # against 8,192 * 128 = 1 MiB
    assert PER_TOKEN == kv_cache_bytes_per_token(model_cfg())
    sampled = SampleConfig(max_new_tokens=2000, temperature=1.0, seed=0, top_k=0, top_p=1.0,
                           min_p=0.0)
    tokens = [s.token for s in generate(lm, [1, 2, 3, 4, 5], sampled)]
    assert len(tokens) == 2000 and len(set(tokens[-500:])) >= 5  # not stuck on one token
    cache = lm.cache
    assert cache.length == 5 + 1999 and cache.capacity == 2048  # 64 128 256 ... 2048
    assert 2000 + 5 <= cache.capacity < CONTEXT
    assert cache.nbytes == 2048 * PER_TOKEN == CONTEXT * PER_TOKEN // 4
    assert cache.peak_bytes == (1024 + 2048) * PER_TOKEN  # the old buffer, during the copy
    assert describe_memory(cache) == ("KV cache: 2,048 of 8,192 positions allocated, 256.0 KiB "
                                      "(peak 384.0 KiB; the whole context: 1.0 MiB)")
    # A batch cache grows the same way: its longest row (7 + 149 tokens) takes 256 columns.
    out = generate_batch_ids(lm, [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10]],
                             SampleConfig(max_new_tokens=150, temperature=0.0))
    assert [len(o) for o in out] == [150, 150]
    assert (lm.batch_cache.length, lm.batch_cache.capacity) == (7 + 149, 256)


@pytest.mark.parametrize("engine", ["torch", "numpy"])
@pytest.mark.parametrize("pos", ["rope", "learned", "sinusoidal"])
def test_every_logit_across_growth_equals_a_preallocated_cache_bit_for_bit(engine, pos,
                                                                            monkeypatch):
    """(The grown caches' fresh memory holds NaN: growth zeroes what it does not copy.)"""
    nan_memory(monkeypatch)
    cfg = model_cfg(pos, block_size=300)
    lm = make_lm(engine, cfg)
    ids = [int(t) for t in np.random.default_rng(7).integers(0, VOCAB, 280)]

    def steps(cache: KVCache) -> np.ndarray:
        lm.cache = cache
        return np.stack([lm.prefill(ids[:60])] + [lm.decode(t) for t in ids[60:]])

    growing = steps(lm._new_cache(1))
    assert lm.cache.capacity == 300  # 64, 128, 256, then the context: 300
    fixed = steps(preallocated(engine, cfg))
    assert np.abs(fixed).max() > 1.0 and np.array_equal(growing, fixed)


@pytest.mark.parametrize("engine", ["torch", "numpy"])
@pytest.mark.parametrize("pos", ["rope", "sinusoidal"])
def test_past_the_context_a_grown_cache_rolls_or_refills_as_a_preallocated_one(engine, pos):
    """Rope: the cache grows to the context (100), then becomes a ring; sinusoidal: the window
    slides by a chunk and the cache is refilled (its capacity kept). The same tokens as the
    preallocated cache and as the uncached reference, far past the context. (Sampled, seeded:
    this tiny model's greedy tokens soon repeat one or two tokens.)"""
    cfg = model_cfg(pos, block_size=100)
    lm = make_lm(engine, cfg)
    sc = SampleConfig(max_new_tokens=250, temperature=1.0, seed=4, top_k=0, top_p=1.0,
                      min_p=0.0)  # the whole distribution: many tokens

    def tokens(use_cache: bool = True) -> list[int]:
        return [s.token for s in generate(lm, [3, 1, 4], sc, use_cache=use_cache)]

    grown_tokens = tokens()
    assert lm.cache.capacity == 100 and lm.cache.peak_bytes == (64 + 100) * PER_TOKEN
    # 3 + 249 tokens seen: rope's ring holds them all; the sinusoidal window starts at
    # 25 * ceil((252 - 100) / 25) = 175 (chunks of 100 // 4), so its refilled cache holds 77.
    assert lm.cache.length == (252 if pos == "rope" else 77)
    lm.cache = preallocated(engine, cfg)
    assert grown_tokens == tokens() == tokens(use_cache=False)
    assert len(set(grown_tokens[150:])) >= 10


@pytest.mark.parametrize("engine", ["torch", "numpy"])
def test_the_running_batch_holds_the_rows_and_columns_in_flight(engine, monkeypatch):
    """Six sequences join a batch of 16 rows at once and leave when done: each gets the greedy
    tokens it gets alone (across the doublings of its columns and the shrinking of its rows),
    and at every step the store holds between 1x and 4x the rows and columns in use. Every
    cache's fresh memory holds NaN: a padding column read under the mask is a zeroed one."""
    nan_memory(monkeypatch)
    lm = make_lm(engine, model_cfg())
    prompts = [[(7 * i + n) % VOCAB for i in range(n)] for n in (3, 10, 17, 30, 45, 60)]
    wanted = [150, 40, 100, 180, 20, 90]
    alone = [greedy(lm, p, n) for p, n in zip(prompts, wanted)]
    batch = RunningBatch(lm, 16)
    assert batch.nbytes == 0
    first = batch.join(prompts)
    assert (batch.store.batch, batch.store.capacity) == (6, 64)
    out = [[int(np.argmax(z))] for z in first]
    running, sizes = list(range(6)), set()
    while running:
        order = batch.leave([r for r, i in enumerate(running) if len(out[i]) == wanted[i]])
        running = [running[o] for o in order]
        if not running:
            break
        for i, z in zip(running, batch.step([out[i][-1] for i in running])):
            out[i].append(int(np.argmax(z)))
        store = batch.store
        assert batch.rows <= store.batch < 4 * batch.rows
        assert batch.length <= store.capacity < 4 * max(batch.length, 64)
        assert batch.nbytes == store.batch * store.capacity * PER_TOKEN
        sizes.add((store.batch, store.capacity))
    assert out == alone
    assert {(6, 128), (6, 256), (2, 256)} <= sizes  # grown twice; rows shrunk at 1 of 6
    # At most 288 KiB (6 rows of 128 columns, and of 256 while copying), where 16 rows of
    # the whole context would have been 16 MiB from the start.
    assert batch.nbytes == 0 and batch.peak_bytes == (6 * 128 + 6 * 256) * PER_TOKEN


def test_the_scheduler_reports_the_bytes_of_its_running_batch():
    from sheepop.serve.api.scheduler import Scheduler
    scheduler = Scheduler(make_model("numpy", model_cfg()), max_batch=16, max_queue=4,
                          timeout=10.0)
    assert scheduler.status()["kv_cache_bytes"] == 0
    from sheepop.generation.prefill import Prefill
    prompt = Prefill(scheduler.lm, [1, 2, 3])
    prompt.advance(3)
    scheduler.batch.place(prompt, copies=3)
    assert scheduler.status()["kv_cache_bytes"] == 3 * 64 * PER_TOKEN == scheduler.batch.nbytes


@pytest.mark.parametrize("engine", ["torch", "numpy"])
def test_sheepop_generate_prints_the_bytes_it_allocated(engine, tmp_path, capsys):
    from sheepop.checkpoint import format as checkpoint
    from sheepop.cli import main
    from sheepop.tokenizers import train_tokenizer
    tok = train_tokenizer("char", ["abcdefgh ijk.\n"])
    cfg = Config()
    cfg.model = ModelConfig(**{**SHAPE, "vocab_size": tok.vocab_size}, block_size=CONTEXT,
                            head_bias=True, **ROPE)
    weights = random_weights(cfg.model)
    weights["head.bias"][tok.eos_id] = -100.0  # never ends early: 100 tokens
    checkpoint.save_checkpoint(tmp_path / "run", weights, cfg.to_dict(), tok.to_json())
    assert main(["generate", str(tmp_path / "run"), "--prompt", "ab", "--max-new-tokens",
                 "100", "--engine", engine, "--device", "cpu"]) == 0
    err = capsys.readouterr().err.splitlines()
    # 2 + 99 tokens in 128 columns (64, then 128) of 128 bytes; the context: 8,192 x 128 bytes
    assert err[-2] == ("sheepop: KV cache: 128 of 8,192 positions allocated, 16.0 KiB "
                       "(peak 24.0 KiB; the whole context: 1.0 MiB)")
    assert err[-1].startswith("sheepop: speed: prompt 2 tokens")  # then the speed, last
