"""Looking inside a model on one prompt, written once for both engines (docs/page.md).

An engine runs the prompt once and hands over a `Trace`: every layer's attention weights, the
residual stream after the embedding and after each block, and `lens`, its own final norm and
head. From it `inspection` computes, in NumPy:

    attention      A_l,h = softmax(Q K^T / sqrt(d_k) + M)       (H, T, T) per layer l
                   (docs/math/04-attention.md), row t: query t over keys 0..t
    logit lens     p_l(. | x_<=t) = softmax(Norm_f(h_l,t) W_head^T (+ b))     l = 0 .. L
                   h_0 the embedding, h_l block l's output; at l = L it is the model's own
                   next-token distribution (docs/math/07-transformer.md)
    next token     p(. | x_<=t) = p_L: its top-k at every position, and the probability of the
                   prompt's own next token x_t+1 (its loss is -log of it, docs/math/08-loss.md)
    positions      sinusoidal or learned: the rows P[t] added to the embeddings; rope: the
                   angles t * omega_i, omega_i = theta^(-2i/d_k) (docs/math/03-positions.md)

Probabilities are computed in float64 from the engine's float32 logits, and only the top k
and the prompt's own next token's of each row: never a (T, V) table of them (`distribution`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from sheepop.config.schema import ModelConfig
from sheepop.positional import digit_places, place_rope_frequencies, rope_frequencies, term_index

MAX_POSITION_COLUMNS = 128
"""The positional table's columns shown (the first ones: the fastest-turning frequencies)."""
LENS_ROWS = 256
"""Rows of residual stream put through the head at once: a (256, d) x (d, V) product keeps the
BLAS busier than a 64-row one (1.5x at V = 49k) and its logits stay near 50 MB."""


@dataclass
class Trace:
    """What an engine computes for one prompt of T tokens (float32 NumPy arrays)."""
    attention: list[np.ndarray]                 # L arrays (H, T, T)
    residuals: list[np.ndarray]                 # L + 1 arrays (T, d): h_0 .. h_L
    lens: Callable[[np.ndarray], np.ndarray]    # h (T, d) -> logits (T, V): Norm_f, then head
    positions: np.ndarray | None                # (T, d) rows added to the embeddings; rope: None


@dataclass
class TopK:
    """The k likeliest tokens at each of T positions, likeliest first."""
    ids: np.ndarray      # (..., T, k) int64
    probs: np.ndarray    # (..., T, k) float64


@dataclass
class Inspection:
    ids: list[int]
    attention: list[np.ndarray]    # L arrays (H, T, T) float32, zero above the diagonal
    next: TopK                     # (T, k): the model's own next-token distribution, p_L
    next_prob: np.ndarray          # (T,) p_L(x_t+1), NaN at the last position
    lens: TopK | None              # (L + 1, T, k), its last layer `next`; None: not asked
    lens_next: np.ndarray | None   # (L + 1, T) p_l(x_t+1), NaN at the last position
    positions_kind: str            # sinusoidal | learned | rope
    positions: np.ndarray          # (T, columns): P[t] rows, or rope's angles t * omega_i
    position_columns: int          # the table's full width (d, or d_k / 2 for rope)


def softmax(logits: np.ndarray) -> np.ndarray:
    """p_i = exp(z_i - max z) / sum_j exp(z_j - max z) over the last axis, in float64."""
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """The ids of the k largest scores of each row, largest first (ties: the smaller id first).

    A partition finds the k largest in O(V), and only they are sorted: a 49k vocabulary costs a
    pass, not a sort (40x faster). A row whose k-th score is tied beyond the k (where the
    partition may have kept a larger id) sorts all the ids scoring that much or more."""
    k = min(k, scores.shape[-1])
    flat = scores.reshape(-1, scores.shape[-1])
    picked = np.argpartition(-flat, k - 1, axis=-1)[:, :k]
    values = np.take_along_axis(flat, picked, axis=-1)
    out = np.take_along_axis(picked, np.lexsort((picked, -values), axis=-1), axis=-1)
    kth = values.min(axis=-1, keepdims=True)
    for row in np.flatnonzero((flat >= kth).sum(axis=-1) > k):
        ids = np.flatnonzero(flat[row] >= kth[row])
        out[row] = ids[np.argsort(-flat[row, ids], kind="stable")[:k]]
    return out.astype(np.int64).reshape(*scores.shape[:-1], k)


def distribution(logits: np.ndarray, ids: list[int], k: int) -> tuple[TopK, np.ndarray]:
    """The top k of p = softmax(z) at each position, and p(x_t+1 | x_<=t) for t = 0 .. T-2 (NaN
    at T-1: no next token in the prompt): log p_i = z_i - m - log sum_j exp(z_j - m), m = max z.
    Only those k + 1 probabilities per row are formed, in float64, never the (T, V) table of
    them; the normaliser's V terms are float32 exponentials (each within 1.2e-7 of its float64
    value, 10x faster) summed in float64."""
    z = np.asarray(logits, dtype=np.float32)
    peak = z.max(axis=-1, keepdims=True)
    log_norm = np.log(np.exp(z - peak).sum(axis=-1, dtype=np.float64, keepdims=True))
    log_norm += peak  # log sum_j exp(z_j), float64: then log p_i = z_i - log_norm exactly
    top = top_k(z, k)
    log_p = np.take_along_axis(z, top, axis=-1).astype(np.float64) - log_norm
    following = np.full(z.shape[0], np.nan)
    rows = np.arange(len(ids) - 1)
    following[:-1] = np.exp(z[rows, ids[1:]].astype(np.float64) - log_norm[rows, 0])
    return TopK(top, np.exp(log_p)), following


def lens_distributions(trace: Trace, residuals: list[np.ndarray], ids: list[int], k: int
                       ) -> list[tuple[TopK, np.ndarray]]:
    """`distribution` of each residual stream's lens, put through the head LENS_ROWS rows at a
    time (several layers of a short prompt in one product: Norm_f and the head act row by
    row)."""
    n = len(ids)
    group = max(1, LENS_ROWS // n)
    out = []
    for start in range(0, len(residuals), group):
        logits = trace.lens(np.concatenate(residuals[start:start + group]))
        out += [distribution(logits[i:i + n], ids, k) for i in range(0, len(logits), n)]
    return out


def rope_angles(n_positions: int, cfg: ModelConfig) -> np.ndarray:
    """theta_t,i = t * omega_i (T, d_k / 2): the angle RoPE turns pair i of a query or key at
    position t by (sheepop.positional.rope_frequencies)."""
    t = np.arange(n_positions, dtype=np.float64)[:, None]
    return t * rope_frequencies(cfg.head_dim, cfg.rope_theta)[None, :]


def inspection(trace: Trace, cfg: ModelConfig, ids: list[int], k: int = 5,
               lens: bool = True) -> Inspection:
    """The `Inspection` of a prompt from its engine's `Trace`, the top `k` tokens per row; the
    logit lens of every layer with `lens`, else only the last layer's (the next token)."""
    ids = [int(i) for i in ids]
    tops, nexts = zip(*lens_distributions(trace, trace.residuals if lens
                                          else trace.residuals[-1:], ids, k))
    layers = (TopK(np.stack([t.ids for t in tops]), np.stack([t.probs for t in tops]))
              if lens else None)
    if cfg.pos_encoding == "none":  # no positional encoding: nothing to show
        table, width = np.zeros((len(ids), 0)), 0
    elif cfg.pos_encoding == "rope_terms":  # turned by the index of each token's number
        turns = term_index(np.asarray([ids]))[0].astype(np.float64)[:, None]
        table = turns * rope_frequencies(cfg.head_dim, cfg.rope_theta)[None, :]
        width = cfg.head_dim // 2
    elif cfg.pos_encoding == "rope_places":  # turned by (term index, digit place)
        row = np.asarray([ids])
        turns = np.stack([term_index(row)[0], digit_places(row)[0]], axis=-1)
        table = turns.astype(np.float64) @ place_rope_frequencies(cfg.head_dim, cfg.rope_theta)
        width = cfg.head_dim // 2
    elif trace.positions is None:
        table, width = rope_angles(len(ids), cfg), cfg.head_dim // 2
    else:
        table, width = trace.positions, cfg.n_embd
    attention = [np.asarray(a, dtype=np.float32) for a in trace.attention]
    return Inspection(ids, attention, tops[-1], nexts[-1], layers,
                      np.stack(nexts) if lens else None, cfg.pos_encoding,
                      np.asarray(table[:, :MAX_POSITION_COLUMNS], dtype=np.float64), width)
