"""Looking inside a model on one prompt, written once for both engines (docs/page.md).

An engine runs the prompt once and hands over a `Trace`: the attention weights of the layers
asked (only those: SmolLM2's 30 layers of 9 heads hold 1.1 GB of them at 1,000 tokens, 72 GB at
8,192), the residual stream after the embedding and after each block, and `lens`, its own final
norm and head. From it `inspection` computes, in NumPy:

    attention      A_l,h = softmax(Q K^T / sqrt(d_k) + M)       (H, T, T) per layer l asked
                   (docs/math/04-attention.md), row t: query t over keys 0..t
    logit lens     p_l(. | x_<=t) = softmax(Norm_f(h_l,t) W_head^T (+ b))     l = 0 .. L
                   h_0 the embedding, h_l block l's output; at l = L it is the model's own
                   next-token distribution (docs/math/07-transformer.md)
    next token     p(. | x_<=t) = p_L: its top-k at every position, and the probability of the
                   prompt's own next token x_t+1 (its loss is -log of it, docs/math/08-loss.md)
    per layer      the rank of x_t+1 under p_l (1: the likeliest), the entropy
                   H(p_l) = -sum_i p_l,i ln p_l,i and KL(p_L || p_l) = sum_i p_L,i ln(p_L,i / p_l,i)
                   in nats: how far each layer's guess is from the model's final one
    positions      sinusoidal or learned: the rows P[t] added to the embeddings; rope: the
                   angles t * omega_i, omega_i = theta^(-2i/d_k) (docs/math/03-positions.md)

Every distribution is the one the sampler draws from at temperature 1: the model's
`never_generate` ids (padding, BOS, unknown: sheepop.inference.load.never_generated) get logit
-inf, probability 0, as in sheepop.generation.generate.next_token and the API's logprobs, so
one token has one p on every view of the page.

Probabilities are computed in float64 from the engine's float32 logits, and only the top k
and the prompt's own next token's of each row: never a (T, V) float64 table of them
(`distribution`).
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
    attention: dict[int, np.ndarray]            # layer l asked -> (H, T, T)
    residuals: list[np.ndarray]                 # L + 1 arrays (T, d): h_0 .. h_L
    lens: Callable[[np.ndarray], np.ndarray]    # h (T, d) -> logits (T, V): Norm_f, then head
    positions: np.ndarray | None                # (T, d) rows added to the embeddings; rope: None
    never: tuple[int, ...] = ()                 # ids the sampler never draws (logit -inf)


@dataclass
class TopK:
    """The k likeliest tokens at each of T positions, likeliest first."""
    ids: np.ndarray      # (..., T, k) int64
    probs: np.ndarray    # (..., T, k) float64


@dataclass
class Rows:
    """One layer's distributions p_l(. | x_<=t) at T positions, summarised."""
    top: TopK
    following: np.ndarray   # (T,) p_l(x_t+1), NaN at the last position
    rank: np.ndarray        # (T,) int64: 1 + the tokens scoring more than x_t+1; 0 at the last
    entropy: np.ndarray     # (T,) H(p_l) in nats
    kl: np.ndarray          # (T,) KL(p_L || p_l) in nats (0 at the last layer)


@dataclass
class Inspection:
    ids: list[int]
    attention: dict[int, np.ndarray]  # layer l asked -> (H, T, T) float32, 0 above the diagonal
    n_layer: int
    n_head: int
    next: TopK                     # (T, k): the model's own next-token distribution, p_L
    next_prob: np.ndarray          # (T,) p_L(x_t+1), NaN at the last position
    lens: TopK | None              # (L + 1, T, k), its last layer `next`; None: not asked
    lens_next: np.ndarray | None   # (L + 1, T) p_l(x_t+1), NaN at the last position
    lens_rank: np.ndarray | None   # (L + 1, T) rank of x_t+1 under p_l (1: top), 0 at the last
    lens_entropy: np.ndarray | None  # (L + 1, T) H(p_l), nats
    lens_kl: np.ndarray | None     # (L + 1, T) KL(p_L || p_l), nats
    next_entropy: np.ndarray       # (T,) H(p_L), nats
    logits: dict[int, np.ndarray]  # position t -> (V,) float32 final logits z (never: -inf)
    positions_kind: str            # sinusoidal | learned | rope
    positions: np.ndarray          # (T, columns): P[t] rows, or rope's angles t * omega_i
    position_columns: int          # the table's full width (d, or d_k / 2 for rope)


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


def masked(logits: np.ndarray, never: tuple[int, ...]) -> np.ndarray:
    """float32 logits with the never-generated ids at -inf (the sampler's rule), in place when
    they are float32 already (the head's fresh output)."""
    z = np.asarray(logits, dtype=np.float32)
    if never:
        z[:, list(never)] = -np.inf
    return z


def distribution(z: np.ndarray, after: np.ndarray, k: int, never: tuple[int, ...] = (),
                 final: tuple[np.ndarray, np.ndarray] | None = None
                 ) -> tuple[Rows, np.ndarray]:
    """The `Rows` of logits z (n, V) (never-generated ids already -inf; z is shifted in place),
    the token after each row `after` (n,) (-1: none), and p = softmax(z) (n, V) float32 for the
    next layers' KL.

    log p_i = z_i - m - log S, m = max z, S = sum_j exp(z_j - m): only the top k and x_t+1's
    probabilities are formed, in float64; the normaliser's V terms are float32 exponentials
    (each within 1.2e-7 of its float64 value, 10x faster) summed in float64. With u = z - m,

        H(p)        = log S - sum_i p_i u_i
        KL(q || p)  = sum_i q_i (ln q_i - ln p_i) = -H(q) - sum_i q_i u_i + log S

    for q = `final` = (p_L, H(p_L)), the sums float32 dot products (within about 1e-6 of
    float64's; a never-generated id has p = q = 0, its term 0)."""
    peak = z.max(axis=-1, keepdims=True)
    u = np.subtract(z, peak, out=z)  # (in place: z is the head's fresh output, consumed here)
    top = top_k(u, k)  # (ranks and tops are the same on u = z - m)
    rows = np.flatnonzero(after >= 0)
    target = np.full(len(u), np.inf, dtype=np.float32)  # (no next token: ranked 0, p NaN)
    target[rows] = u[rows, after[rows]]
    rank = np.where(after >= 0, 1 + (u > target[:, None]).sum(axis=-1), 0)
    top_u = np.take_along_axis(u, top, axis=-1).astype(np.float64)
    if never:  # u = 0 there, e = 0 (0 * -inf would be NaN, and exp is 2x slower on -inf)
        u[:, list(never)] = 0.0
    e = np.exp(u)
    if never:
        e[:, list(never)] = 0.0
    total = e.sum(axis=-1, dtype=np.float64)
    log_norm = np.log(total)
    entropy = log_norm - np.vecdot(e, u).astype(np.float64) / total
    kl = np.zeros_like(entropy)
    if final is not None:
        q, q_entropy = final
        kl = -q_entropy - np.vecdot(q, u).astype(np.float64) + log_norm
    log_p = top_u - log_norm[:, None]
    following = np.full(len(u), np.nan)
    following[rows] = np.exp(target[rows].astype(np.float64) - log_norm[rows])
    p = e * (1.0 / total).astype(np.float32)[:, None]
    return Rows(TopK(top, np.exp(log_p)), following, rank, entropy, np.maximum(kl, 0.0)), p


def _joined(parts: list[Rows]) -> Rows:
    cat = np.concatenate
    return Rows(TopK(cat([r.top.ids for r in parts]), cat([r.top.probs for r in parts])),
                cat([r.following for r in parts]), cat([r.rank for r in parts]),
                cat([r.entropy for r in parts]), cat([r.kl for r in parts]))


def lens_distributions(trace: Trace, residuals: list[np.ndarray], ids: list[int], k: int
                       ) -> list[Rows]:
    """The `Rows` of each residual stream's lens (the last one: the model's own distribution,
    which the others' KL is measured against), LENS_ROWS positions at a time; several layers of
    a short prompt go through the head in one product (Norm_f and the head act row by row)."""
    n = len(ids)
    after = np.asarray(ids[1:] + [-1], dtype=np.int64)
    parts: list[list[Rows]] = [[] for _ in residuals]
    for a in range(0, n, LENS_ROWS):
        b = min(n, a + LENS_ROWS)
        last, p = distribution(masked(trace.lens(residuals[-1][a:b]), trace.never), after[a:b], k,
                               trace.never)
        parts[-1].append(last)
        group = max(1, LENS_ROWS // (b - a))
        for start in range(0, len(residuals) - 1, group):
            stop = min(len(residuals) - 1, start + group)
            logits = masked(trace.lens(np.concatenate([h[a:b] for h in residuals[start:stop]])),
                            trace.never)
            for i, layer in enumerate(range(start, stop)):
                rows, _ = distribution(logits[i * (b - a):(i + 1) * (b - a)], after[a:b], k,
                                       trace.never, (p, last.entropy))
                parts[layer].append(rows)
    return [_joined(layer) for layer in parts]


def rope_angles(n_positions: int, cfg: ModelConfig) -> np.ndarray:
    """theta_t,i = t * omega_i (T, d_k / 2): the angle RoPE turns pair i of a query or key at
    position t by (sheepop.positional.rope_frequencies)."""
    t = np.arange(n_positions, dtype=np.float64)[:, None]
    return t * rope_frequencies(cfg.head_dim, cfg.rope_theta)[None, :]


def inspection(trace: Trace, cfg: ModelConfig, ids: list[int], k: int = 5,
               lens: bool = True, logits_at: tuple[int, ...] = ()) -> Inspection:
    """The `Inspection` of a prompt from its engine's `Trace`, the top `k` tokens per row; the
    logit lens of every layer with `lens`, else only the last layer's (the next token); the
    final logits of the positions `logits_at`."""
    ids = [int(i) for i in ids]
    layers = lens_distributions(trace, trace.residuals if lens else trace.residuals[-1:], ids, k)
    last = layers[-1]
    stacked = lambda f: np.stack([f(r) for r in layers]) if lens else None  # noqa: E731
    lens_top = (TopK(stacked(lambda r: r.top.ids), stacked(lambda r: r.top.probs))
                if lens else None)
    rows = sorted(set(int(t) for t in logits_at))
    logits = ({} if not rows else
              dict(zip(rows, masked(trace.lens(trace.residuals[-1][rows]), trace.never))))
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
    attention = {layer: np.asarray(a, dtype=np.float32) for layer, a in trace.attention.items()}
    return Inspection(ids, attention, cfg.n_layer, cfg.n_head, last.top, last.following, lens_top,
                      stacked(lambda r: r.following), stacked(lambda r: r.rank),
                      stacked(lambda r: r.entropy), stacked(lambda r: r.kl), last.entropy,
                      logits, cfg.pos_encoding,
                      np.asarray(table[:, :MAX_POSITION_COLUMNS], dtype=np.float64), width)
