"""The generation loops shared by both engines: prompt -> tokens, one at a time, streamed.

An engine takes part through a `LanguageModel` adapter that returns the next-token logits of the
last position as NumPy, with or without its KV cache (and, for `generate_batch`, a
`BatchLanguageModel` that does the same for several left-padded sequences at once; both in
sheepop.generation.protocol).

The window: which tokens the model sees at each step. Let `ids` be the prompt cropped to its
last T = `block_size` tokens, then every generated token, and n = len(ids) when a step computes
the logits of the next token. Each loop, with or without the cache, computes

    logits = f(ids[s(n):n])

- rotary positions (`lm.slides`): s(n) = 0, and f attends over the T most recent keys at every
  layer (sliding-window attention): the cache rolls on at one decode step per token, and the
  uncached reference recomputes the whole sequence under that window (sheepop.arch.kv_cache);
- absolute positions (sinusoidal, learned; a position past the table does not exist): the
  window slides by a chunk of C = `slide_chunk(cfg, T)` tokens at once,

      s(n) = 0                          while n <= T
      s(n) = C * ceil((n - T) / C)      past it,

  and f sees its window at positions 0 .. n - s(n) - 1. The window holds T - C + 1 .. T tokens:
  when the next token would make it T + 1, the oldest C leave together, and the cache is
  refilled once (a prefill of the T - C + 1 tokens left) and then takes C - 1 decode steps.
  C = 1 is "always the last T tokens" (a whole-window prefill per token, the slowest);
  `sample.slide_chunk` sets C (0: T // DEFAULT_CHUNK_FRACTION = T // 4; docs/inference.md).

The uncached path (`use_cache=False`, `lm.full`) computes exactly the same windows: it is the
reference the cache is tested against. In `generate_batch` each row follows its own s(n) (a
refill of the whole batch, each row at its own window, whenever any row slides), so a prompt in
a batch sees what it sees alone.

Every step of every sequence draws the next token from its own `numpy.random.Generator`, so a
prompt generated inside a batch gets the same tokens as generated alone. The tokens a model lists
in `never_generate` (set by sheepop.inference.load: padding, BOS, unknown) get probability 0
in every loop. A sequence may carry a constraint's state (sheepop.generation.constraint): its
mask of the tokens the grammar allows is applied first, and the state takes each token drawn; in
a batch each row has its own. sheepop.generation.text_stream turns these tokens into text:
pieces streamed as they become certain, and stop strings.
"""

from __future__ import annotations

from collections.abc import Collection, Generator, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from sheepop.config.schema import SampleConfig
from sheepop.generation.constraint import ConstraintState
from sheepop.generation.protocol import BatchLanguageModel, LanguageModel
from sheepop.generation.sample import (
    check_finite,
    check_settings,
    filtered_logits,
    quiet_overflow,
    resolved_seed,
    top_tokens,
)
from sheepop.generation.speculative import Gate, judge, speculated

# Past the context, absolute positions drop the oldest block_size // 4 tokens at once by default:
# the refill then comes once per T / 4 tokens, which kept past-context generation at 0.70-1.01x
# of in-context speed at the baby and tiny shapes on a busy 2-core machine, one thread (T / 8:
# 0.45x in the NumPy engine; benchmarks/past_context.py --absolute, docs/inference.md), while
# every step still sees at least 3/4 of a context.
DEFAULT_CHUNK_FRACTION = 4


def slide_chunk(cfg: SampleConfig, block_size: int) -> int:
    """C, the tokens an absolute-position window drops at once: `cfg.slide_chunk`, or
    block_size // DEFAULT_CHUNK_FRACTION when it is 0 (at least 1, at most block_size)."""
    chunk = cfg.slide_chunk or block_size // DEFAULT_CHUNK_FRACTION
    return max(1, min(chunk, block_size))


def window_start(n: int, block_size: int, chunk: int) -> int:
    """s(n): the first of n tokens an absolute-position model sees, 0 while n <= T, else
    C * ceil((n - T) / C) (T = block_size, C = chunk): ids[s(n):n] is 1 .. T tokens long."""
    return 0 if n <= block_size else chunk * -(-(n - block_size) // chunk)


@dataclass
class Step:
    token: int
    top: list[tuple[int, float]]  # the K most likely next tokens (only with show_probs)


def _check(cfg: SampleConfig) -> None:
    if cfg.repetition_penalty <= 0:
        raise ValueError(f"repetition_penalty must be > 0, got {cfg.repetition_penalty}")


def never_generated(lm: LanguageModel | BatchLanguageModel) -> list[int]:
    """The ids `lm` must never produce (set by sheepop.inference.load from the tokenizer)."""
    return list(getattr(lm, "never_generate", ()))


def next_token(logits: np.ndarray, cfg: SampleConfig, rng: np.random.Generator,
               seen: np.ndarray | None = None, want_probs: bool = False,
               never: Sequence[int] = (), allowed: np.ndarray | None = None,
               proposed: int | None = None) -> tuple[int, np.ndarray | None]:
    """One token from one row of logits, and the distribution it was drawn from.

    The `never` ids, and where `allowed` (bool, the logits' shape: a constraint's mask) is
    False, get logit -inf first (probability 0). Greedy (temperature 0) takes the
    argmax and reports softmax(z) as the distribution, only when `want_probs` (a float64
    softmax over a 50k vocabulary is not free). A `proposed` token (speculative decoding) is
    kept or replaced by the acceptance rule (sheepop.generation.speculative.judge): the token
    is distributed as without it.
    """
    check_settings(cfg.temperature, cfg.top_k, cfg.top_p, cfg.min_p)  # ValueError: a bad call
    check_finite(logits)
    z = filtered_logits(logits, seen, cfg.repetition_penalty, never, allowed)
    return judge(z, cfg, rng, proposed, want_probs)


@quiet_overflow
def generate(lm: LanguageModel, prompt: Sequence[int], cfg: SampleConfig,
             use_cache: bool = True, eos_id: int | None = None, show_probs: int = 0,
             constraint: ConstraintState | None = None, gate: Gate | None = None
             ) -> Iterator[Step]:
    """Yield up to `cfg.max_new_tokens` tokens after `prompt`, stopping after `eos_id`; only
    tokens `constraint` allows, when given.

    An iterator: each token is yielded as soon as it is drawn (stop iterating to stop early).
    With `cfg.speculate` k > 0 (and the cache) up to k tokens guessed from the text are checked
    in one pass (sheepop.generation.speculative): the same greedy tokens, and samples of the
    same distribution (not the same draws: the seed's numbers are used differently); `gate`
    (a fresh one by default) decides when to propose and counts the passes and kept tokens.
    """
    if len(prompt) == 0:
        raise ValueError("generation needs at least one prompt token")
    _check(cfg)
    T = lm.block_size
    ids = list(prompt)[-T:]
    rng = np.random.default_rng(resolved_seed(cfg.seed))  # (-1: a fresh seed)
    logits = lm.prefill(ids) if use_cache else lm.full(ids)
    seen = _seen_mask(prompt, logits.shape[-1]) if cfg.repetition_penalty != 1.0 else None
    never = never_generated(lm)
    slides = getattr(lm, "slides", False)
    chunk, start = slide_chunk(cfg, T), 0  # absolute positions: the model sees ids[start:]
    speculates = cfg.speculate > 0 and use_cache and hasattr(lm, "verify")
    gate = (gate or Gate()) if speculates else None
    n = 0
    while n < cfg.max_new_tokens:
        allowed = None if constraint is None else constraint.allowed(logits.shape[-1])
        token, shown = next_token(logits, cfg, rng, seen, show_probs > 0, never, allowed)
        if constraint is not None:
            constraint.advance(token)
        shown_top = top_tokens(shown, show_probs) if show_probs and shown is not None else []
        yield Step(token, shown_top)
        n += 1
        if (eos_id is not None and token == eos_id) or n == cfg.max_new_tokens:
            return  # (no forward pass for logits nobody will read)
        ids.append(token)
        if seen is not None:
            seen[token] = True
        if gate is not None:  # until the cache has no room: then the plain steps below
            for token, shown in speculated(lm, ids, cfg, rng, seen, never, constraint, eos_id,
                                           cfg.max_new_tokens - n, gate, show_probs > 0):
                yield Step(token, top_tokens(shown, show_probs) if show_probs else [])
                n += 1
            if token == eos_id or n == cfg.max_new_tokens:
                return
            gate = None
        if slides:  # rotary positions: the ring (or the windowed reference) takes it
            logits = lm.decode(token) if use_cache else lm.full(ids)
            continue
        before, start = start, window_start(len(ids), T, chunk)
        if not use_cache:
            logits = lm.full(ids[start:])
        elif start == before:
            logits = lm.decode(token)
        else:  # the window slid by a chunk: refill the cache with what is left of it
            logits = lm.prefill(ids[start:])


def _seen_mask(ids: Sequence[int], vocab: int) -> np.ndarray:
    """Boolean (V,): True at the tokens in `ids` (those the repetition penalty applies to)."""
    mask = np.zeros(vocab, dtype=bool)
    mask[list(ids)] = True
    return mask


@dataclass
class _Rows:
    """The prompts of a batch as it runs: prompt b's tokens `ids[b]` (the prompt cropped to the
    context, then what it generated), its generator and repeated-token mask, and `starts[b]`,
    the first token its window holds (absolute positions: s(n)), its constraint's state (or
    None); row r of the model's batch is prompt `active[r]`."""
    ids: list[list[int]]
    rngs: list[np.random.Generator]
    seen: list[np.ndarray] | None
    starts: list[int]
    active: list[int]
    constraints: list[ConstraintState | None]

    def windows(self) -> list[list[int]]:
        """What each active row's model sees: ids[b][starts[b]:]."""
        return [self.ids[b][self.starts[b]:] for b in self.active]

    def last_tokens(self) -> list[int]:
        return [self.ids[b][-1] for b in self.active]

    def slide(self, block_size: int, chunk: int) -> bool:
        """Move each active row's window start to s(n); whether any of them moved."""
        before = [self.starts[b] for b in self.active]
        for b in self.active:
            self.starts[b] = window_start(len(self.ids[b]), block_size, chunk)
        return before != [self.starts[b] for b in self.active]


def _start_rows(prompts: Sequence[Sequence[int]], cfg: SampleConfig, block_size: int,
                seeds: Sequence[int] | None,
                constraints: Sequence[ConstraintState | None] | None) -> _Rows:
    """Check the prompts, seeds and constraints; each prompt's row, before its first token."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("generation needs at least one prompt token in every prompt")
    _check(cfg)
    seeds = [resolved_seed(cfg.seed)] * len(prompts) if seeds is None else list(seeds)
    if len(seeds) != len(prompts):
        raise ValueError(f"{len(seeds)} seeds for {len(prompts)} prompts")
    constraints = [None] * len(prompts) if constraints is None else list(constraints)
    if len(constraints) != len(prompts):
        raise ValueError(f"{len(constraints)} constraints for {len(prompts)} prompts")
    return _Rows([list(p)[-block_size:] for p in prompts],
                 [np.random.default_rng(s) for s in seeds], None, [0] * len(prompts),
                 list(range(len(prompts))), constraints)


def _draw_rows(rows: _Rows, logits: np.ndarray, cfg: SampleConfig, never: Sequence[int],
               eos_id: int | None) -> tuple[list[int | None], list[int]]:
    """One token for each active prompt (None for the others), appended to its ids; and the
    model rows whose prompt goes on (it did not draw `eos_id`)."""
    out: list[int | None] = [None] * len(rows.ids)
    still = []
    for r, b in enumerate(rows.active):
        row_seen = rows.seen[b] if rows.seen is not None else None
        state = rows.constraints[b]
        allowed = None if state is None else state.allowed(logits.shape[-1])
        token, _ = next_token(logits[r], cfg, rows.rngs[b], row_seen, never=never,
                              allowed=allowed)
        if state is not None:
            state.advance(token)
        out[b] = token
        rows.ids[b].append(token)
        if row_seen is not None:
            row_seen[token] = True
        if eos_id is None or token != eos_id:
            still.append(r)
    return out, still


def _keep_rows(lm: BatchLanguageModel, rows: _Rows, still: list[int], use_cache: bool) -> None:
    """Prompts that ended leave the batch (and their rows the cache)."""
    if len(still) < len(rows.active):
        if use_cache:
            lm.keep_rows(still)
        rows.active = [rows.active[r] for r in still]


def _next_logits(lm: BatchLanguageModel, rows: _Rows, use_cache: bool, chunk: int
                 ) -> np.ndarray:
    """The logits after each active row's newest token, in the case the batch is in."""
    if getattr(lm, "slides", False):  # rotary positions: the ring (or the windowed reference)
        # takes the token; a row's window never starts past 0
        return (lm.decode_batch(rows.last_tokens()) if use_cache
                else lm.full_batch(rows.windows()))
    moved = rows.slide(lm.block_size, chunk)
    if not use_cache:  # the reference: every row's window recomputed
        return lm.full_batch(rows.windows())
    if not moved and lm.batch_length < lm.block_size:  # every row's window takes the token
        return lm.decode_batch(rows.last_tokens())
    # a row's window slid (or a row that left held the longest span of columns): the cache
    # is refilled, each row with its own window
    return lm.prefill_batch(rows.windows())


@quiet_overflow
def generate_batch(lm: BatchLanguageModel, prompts: Sequence[Sequence[int]],
                   cfg: SampleConfig, use_cache: bool = True, eos_id: int | None = None,
                   seeds: Sequence[int] | None = None,
                   constraints: Sequence[ConstraintState | None] | None = None
                   ) -> Generator[list[int | None], Collection[int] | None, None]:
    """Generate after several prompts at once; yield, at each step, one token per prompt.

    A prompt that has ended (its `eos_id`, or `max_new_tokens`) gets None and leaves the batch;
    `send(indices)` instead of `next` ends those prompts too.
    Row b draws from `numpy.random.default_rng(seeds[b])` (default: `cfg.seed` for every row;
    a fresh one shared by every row when it is -1),
    so its tokens are those `generate` gives for that prompt and seed alone. Row b draws only
    what `constraints[b]` allows (None: any token), each row's state its own.
    """
    rows = _start_rows(prompts, cfg, lm.block_size, seeds, constraints)
    logits = lm.prefill_batch(rows.ids) if use_cache else lm.full_batch(rows.ids)
    if cfg.repetition_penalty != 1.0:
        rows.seen = [_seen_mask(p, logits.shape[-1]) for p in prompts]
    never, chunk = never_generated(lm), slide_chunk(cfg, lm.block_size)
    for n in range(cfg.max_new_tokens):
        out, still = _draw_rows(rows, logits, cfg, never, eos_id)
        ended = yield out  # a caller may `send` prompts that end here (e.g. a stop string)
        if ended:
            still = [r for r in still if rows.active[r] not in ended]
        if not still or n == cfg.max_new_tokens - 1:
            return
        _keep_rows(lm, rows, still, use_cache)
        logits = _next_logits(lm, rows, use_cache, chunk)


def generate_batch_ids(lm: BatchLanguageModel, prompts: Sequence[Sequence[int]],
                       cfg: SampleConfig, use_cache: bool = True, eos_id: int | None = None,
                       seeds: Sequence[int] | None = None,
                       constraints: Sequence[ConstraintState | None] | None = None
                       ) -> list[list[int]]:
    """The new tokens of each prompt (its `eos_id` included when it ended on one)."""
    outputs: list[list[int]] = [[] for _ in prompts]
    for step in generate_batch(lm, prompts, cfg, use_cache, eos_id, seeds, constraints):
        for b, token in enumerate(step):
            if token is not None:
                outputs[b].append(token)
    return outputs
