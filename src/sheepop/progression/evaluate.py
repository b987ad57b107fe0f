"""Batched greedy continuation of held-out progressions, with either engine.

For a sequence t_1 .. t_n and every k = 1 .. n-1, the model is given the first k terms and
writes the next D tokens greedily (argmax at each step); the k-th prefix is right when those D
tokens are exactly the digits of t_(k+1). The context the model sees is what it was trained on:
the last min(k, m-1) terms, each followed by a space, starting on a term boundary (m the
window's terms), so a prefix costs at most m (D+1) - 1 positions however long the sequence.

All prefixes with the same number of context terms have the same length, so they run as one
batch: one forward over the contexts, then D - 1 one-token steps with the engine's KV cache
(`CachedLM.greedy` of a model built by sheepop.inference.load, in either engine).

Continuing the whole rest of the sequence is not run separately: with greedy decoding and the
separator written by the harness, the model's context after k correct terms is the true one, so
the continuation from k is right exactly when every next-term prediction from k on is right
(`scores.continuation`); tests check this against explicit rollouts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sheepop.generation.cached_lm import CachedLM
from sheepop.progression.stream import SPACE_ID, digits_value, term_digits
from sheepop.progression.task import TaskOptions


@dataclass
class Prefixes:
    """Every (sequence, k) prefix of a set: k terms given, term k+1 to predict."""

    seq: np.ndarray  # (N,) index of the sequence in the set
    k: np.ndarray  # (N,) terms given, 1 .. n-1
    difference: np.ndarray  # (N,) the sequence's common difference
    target: np.ndarray  # (N,) the true next term


def prefixes(sequences: list[np.ndarray]) -> tuple[Prefixes, np.ndarray, np.ndarray]:
    """All prefixes, sorted by (sequence, k); also the flat terms and each prefix's offset of
    term k+1 in them (so the context of k terms is flat[pos - k : pos])."""
    lengths = np.array([len(s) for s in sequences], dtype=np.int64)
    flat = np.concatenate(sequences) if sequences else np.zeros(0, np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    seq = np.repeat(np.arange(len(sequences)), np.maximum(lengths - 1, 0))
    k = np.concatenate([np.arange(1, n) for n in lengths]) if len(seq) else seq.copy()
    pos = starts[seq] + k
    diff = np.array([s[1] - s[0] for s in sequences], dtype=np.int64)
    return Prefixes(seq, k.astype(np.int64), diff[seq], flat[pos]), flat, pos


def context_terms(opts: TaskOptions, digits: int) -> int:
    """How many terms of `digits` digits the model is given: m - 1, or fewer when m - 1 terms
    and the answer would not fit in the block it was trained on, m (D+1) - 1 positions (a
    wider number than D: the sets ood_digits_*). 0 when not even two fit (the difference needs
    two terms)."""
    fit = (opts.block_size - digits) // (digits + 1)
    most = min(opts.window_terms - 1, fit)
    return most if most >= 2 else 0


def seen_in_training(train: list[np.ndarray], sequences: list[np.ndarray], opts: TaskOptions,
                     given: int | None = None) -> np.ndarray:
    """For every prefix of `sequences` (the order of `prefixes`): whether its context terms and
    the answer occur, consecutively, in some training sequence. Distinct (first term,
    difference) pairs do not prevent it: 107 114 121 | 128 is inside 100 107 114 121 128 ...
    `given`: the context terms (default m - 1)."""
    spans: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for s in train:
        d = int(s[1] - s[0])
        if d > 0:
            spans.setdefault((d, int(s[0]) % d), []).append((int(s[0]), int(s[-1])))
    pre, flat, pos = prefixes(sequences)
    first = flat[pos - np.minimum(pre.k, given or opts.window_terms - 1)]
    out = np.zeros(len(pos), dtype=bool)
    for i, (d, lo, hi) in enumerate(zip(pre.difference.tolist(), first.tolist(),
                                        pre.target.tolist())):
        if d > 0:
            out[i] = any(a <= lo and hi <= b for a, b in spans.get((d, lo % d), ()))
    return out


def predict_next_terms(lm: CachedLM, sequences: list[np.ndarray], opts: TaskOptions,
                       batch_size: int = 2048, digits: int | None = None
                       ) -> tuple[Prefixes, np.ndarray]:
    """Every prefix and the model's D greedy tokens for it, most significant digit first
    (tokens that are not digits kept as they are: they count as wrong). `digits`: the width of
    these sequences' terms when not the run's D (then `context_terms` of them are given)."""
    pre, flat, pos = prefixes(sequences)
    D = digits or opts.digits
    most = context_terms(opts, D)
    if not most:
        raise ValueError(f"{D}-digit terms do not fit the model's block of {opts.block_size}")
    written = np.full((len(pos), D), SPACE_ID, dtype=np.int64)
    given = np.minimum(pre.k, most)
    for g in np.unique(given):
        rows = np.flatnonzero(given == g)
        for i in range(0, len(rows), batch_size):
            chunk = rows[i:i + batch_size]
            terms = flat[pos[chunk, None] - g + np.arange(g)]  # (B, g) the last g terms
            body = term_digits(terms, D, opts.reverse_digits)
            context = np.concatenate([body, np.full((len(chunk), g, 1), SPACE_ID)], axis=2)
            tokens = lm.greedy(context.reshape(len(chunk), -1), D)
            written[chunk] = tokens[:, ::-1] if opts.reverse_digits else tokens
    return pre, written


def rollout(lm: CachedLM, terms: np.ndarray, k: int, opts: TaskOptions) -> list[int]:
    """Continue `terms[:k]` term by term with the model's own output until len(terms) terms:
    the explicit version of what `scores.continuation` derives. A non-digit output stops it
    (the value -1 is recorded)."""
    seq = [int(v) for v in terms[:k]]
    while len(seq) < len(terms):
        g = min(len(seq), opts.window_terms - 1)
        body = term_digits(np.array(seq[-g:]), opts.digits, opts.reverse_digits)
        context = np.concatenate([body, np.full((g, 1), SPACE_ID)], axis=1).reshape(1, -1)
        value = int(digits_value(lm.greedy(context, opts.digits),
                                 opts.reverse_digits)[0])
        seq.append(value)
        if value < 0:
            break
    return seq[k:]
