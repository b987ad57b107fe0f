"""The numbers behind the position kinds, shared by both engines: the sinusoidal table and the
rotary frequencies.

    P[pos, 2i]   = sin(pos / 10000^(2i / d))
    P[pos, 2i+1] = cos(pos / 10000^(2i / d))

Column pair i is a sine/cosine of wavelength 2*pi * 10000^(2i/d): from 2*pi (i = 0) up to nearly
2*pi * 10000, so every position up to a very long context gets a distinct code, and
P[pos + k] is a fixed rotation of P[pos] for every offset k.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def sinusoidal_table(n_positions: int, d: int, base: float = 10000.0) -> np.ndarray:
    """Return P of shape (n_positions, d) in float64 (d must be even)."""
    pos = np.arange(n_positions, dtype=np.float64)[:, None]
    two_i = np.arange(0, d, 2, dtype=np.float64)[None, :]
    angle = pos / base ** (two_i / d)
    table = np.empty((n_positions, d), dtype=np.float64)
    table[:, 0::2] = np.sin(angle)
    table[:, 1::2] = np.cos(angle)
    return table


def rope_frequencies(head_dim: int, theta: float = 10000.0) -> np.ndarray:
    """omega_i = theta^(-2i / d_k), i = 0 .. d_k/2 - 1, in float64: the angular speed of pair i.

    RoPE turns pair i of a query or key at position p by the angle p * omega_i (the same
    frequencies as the sinusoidal table's columns, with d_k in place of d)."""
    return theta ** -(np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)


def place_rope_frequencies(head_dim: int, theta: float = 10000.0) -> np.ndarray:
    """W (2, d_k/2) in float64 for `rope_places`: a query or key with term index n and digit
    place r turns pair i by the angle (n, r) W,

        angle_i = n omega'_i          for i <  d_k/4   (the first half of the pairs)
        angle_i = r omega'_(i-d_k/4)  for i >= d_k/4   (the second half)
        omega'_j = theta^(-4j / d_k)  (rope_frequencies of a head half as wide)

    so q . k depends only on the two offsets (n_q - n_k, r_q - r_k): which number a key is in
    and which place, relative to the query's, and nothing absolute."""
    half = rope_frequencies(head_dim // 2, theta)
    w = np.zeros((2, head_dim // 2), dtype=np.float64)
    w[0, :len(half)] = half
    w[1, len(half):] = half
    return w


DIGIT_IDS = 10
"""Ids 0 .. 9 are the digits '0' .. '9' (the digits tokenizer, sheepop.tokenizers.digits)."""


ROTATED_BY_DIGITS = ("rope_terms", "rope_places")
"""The rotary kinds whose positions come from the token ids: term indices (rope_terms), term
indices and digit places (rope_places)."""


def uses_digits(cfg: Any) -> bool:
    """Whether a model (its ModelConfig) reads digit places or term indices: then each engine
    computes them from the token ids (model.digit_positions, model.term_positions, or
    pos_encoding rope_terms or rope_places, which turn by them)."""
    return bool(cfg.digit_positions or cfg.term_positions
                or cfg.pos_encoding in ROTATED_BY_DIGITS)


def digit_places(idx: np.ndarray, run_before: np.ndarray | None = None,
                 real: np.ndarray | None = None) -> np.ndarray:
    """The place of every token in its number (B, T) int64: 0 for a token that is not a digit,
    otherwise 1 + the number of digits written immediately before it,

        r_t = (r_{t-1} + 1) [x_t is a digit],    r_{-1} = run_before (0: a fresh sequence)

    computed in one pass: with c_t = run_before + sum_{u <= t} [x_u is a digit] and m_t the
    largest c_u over the non-digits u <= t (0 if none), r_t = c_t - m_t at digits. `run_before`
    (B,) continues a KV cache's rows; `real` (B, T) False marks left padding, which is not a
    digit whatever its id (so a padded prompt gets the places it gets alone)."""
    idx = np.asarray(idx)
    digit = idx < DIGIT_IDS
    if real is not None:
        digit &= real
    before = 0 if run_before is None else np.asarray(run_before, dtype=np.int64)[:, None]
    count = np.cumsum(digit, axis=-1, dtype=np.int64) + before
    last_reset = np.maximum.accumulate(np.where(digit, 0, count), axis=-1)
    return np.where(digit, count - last_reset, 0)


def term_index(idx: np.ndarray, state: np.ndarray | None = None,
               real: np.ndarray | None = None) -> np.ndarray:
    """The number each token belongs to (B, T) int64: how many numbers have ended at or before
    it, counting an end at every non-digit that follows a digit,

        n_t = n_{t-1} + [x_t is not a digit and x_{t-1} is a digit],   n_{-1} = 0

    so the digits of the first number get 0, the separator after it and the next number's
    digits 1, and so on (the separator opens the number that follows: it is where the model
    writes that number's first digit). `state` (B, 2) = (the run of digits before, numbers
    ended before) continues a KV cache's rows; `real` as in `digit_places`."""
    idx = np.asarray(idx)
    digit = idx < DIGIT_IDS
    if real is not None:
        digit &= real
    run_before = np.zeros(len(idx), np.int64) if state is None else state[:, 0]
    ended = 0 if state is None else np.asarray(state[:, 1], np.int64)[:, None]
    previous = np.concatenate([(run_before > 0)[:, None], digit[:, :-1]], axis=1)
    return np.cumsum(~digit & previous, axis=-1, dtype=np.int64) + ended


def place_rows(places: np.ndarray, offset: np.ndarray | int, rows: int) -> np.ndarray:
    """The table row each place reads: place + offset (the training offset, per sequence; 0 at
    inference), so a non-digit (place 0) reads row `offset`: the separator before a number
    stays one row below its first digit, which is how it finds the first digits of the numbers
    before it whatever the offset. A place past the table reads its last row."""
    return np.minimum(places + offset, rows - 1)
