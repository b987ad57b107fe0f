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

Probabilities are computed in float64 from the engine's float32 logits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from sheepop.config import ModelConfig
from sheepop.positional import digit_places, place_rope_frequencies, rope_frequencies, term_index

MAX_POSITION_COLUMNS = 128
"""The positional table's columns shown (the first ones: the fastest-turning frequencies)."""


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
    lens: TopK                     # (L + 1, T, k)
    lens_next: np.ndarray          # (L + 1, T) p_l(x_t+1), NaN at the last position
    positions_kind: str            # sinusoidal | learned | rope
    positions: np.ndarray          # (T, columns): P[t] rows, or rope's angles t * omega_i
    position_columns: int          # the table's full width (d, or d_k / 2 for rope)

    @property
    def next(self) -> TopK:
        """The model's next-token distribution at each position: the lens at the last layer."""
        return TopK(self.lens.ids[-1], self.lens.probs[-1])


def softmax(logits: np.ndarray) -> np.ndarray:
    """p_i = exp(z_i - max z) / sum_j exp(z_j - max z) over the last axis, in float64."""
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def top_k(probs: np.ndarray, k: int) -> TopK:
    """The k largest probabilities of each row (ties: the smaller id first)."""
    k = min(k, probs.shape[-1])
    order = np.argsort(-probs, axis=-1, kind="stable")[..., :k]
    return TopK(order.astype(np.int64), np.take_along_axis(probs, order, axis=-1))


def next_token_probs(probs: np.ndarray, ids: list[int]) -> np.ndarray:
    """p(x_t+1 | x_<=t) for t = 0 .. T-2, and NaN at T-1 (no next token in the prompt)."""
    out = np.full(probs.shape[0], np.nan)
    out[:-1] = probs[np.arange(len(ids) - 1), ids[1:]]
    return out


def rope_angles(n_positions: int, cfg: ModelConfig) -> np.ndarray:
    """theta_t,i = t * omega_i (T, d_k / 2): the angle RoPE turns pair i of a query or key at
    position t by (sheepop.positional.rope_frequencies)."""
    t = np.arange(n_positions, dtype=np.float64)[:, None]
    return t * rope_frequencies(cfg.head_dim, cfg.rope_theta)[None, :]


def inspection(trace: Trace, cfg: ModelConfig, ids: list[int], k: int = 5) -> Inspection:
    """The `Inspection` of a prompt from its engine's `Trace`, the top `k` tokens per row."""
    ids = [int(i) for i in ids]
    tops, nexts = [], []
    for h in trace.residuals:  # one layer at a time: (T, V) probabilities, never (L, T, V)
        probs = softmax(trace.lens(h))
        tops.append(top_k(probs, k))
        nexts.append(next_token_probs(probs, ids))
    lens = TopK(np.stack([t.ids for t in tops]), np.stack([t.probs for t in tops]))
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
    return Inspection(ids, attention, lens, np.stack(nexts), cfg.pos_encoding,
                      np.asarray(table[:, :MAX_POSITION_COLUMNS], dtype=np.float64), width)
