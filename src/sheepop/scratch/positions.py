"""Position encodings of the NumPy engine, one per `model.pos_encoding` kind.

A kind acts in one or both of two places (docs/math/03-positions.md; forward and backward of
sinusoidal, learned, RoPE and digit places in docs/derivations/positions.md):

    embed       h0 = E[x] + P[pos]                      (sinusoidal, learned)
    rotate      q, k -> R(pos) q, R(pos) k per head     (inside attention: rope; scratch/rope.py)

(`none`: neither), and digit places and term indices (`model.digit_positions`,
`model.term_positions`) add A[row of each digit's place in its number] + N[the number it belongs
to] on top of any kind (`digit_rows`, `digit_positions_forward` / `_backward`: lookups).

`pos` is a slice (positions start .. start+T-1 for every row) or an index array (B, T) (each
row of a left-padded batch counts from its own first real token). A `PositionKind` names its
parameters and its forward/backward pairs (None where it does nothing); the torch engine's
units are in sheepop/model/positions.py.

The model reaches this unit through three functions and knows nothing of the kinds:
`position_params` (the parameters, in the checkpoint's order), `positions_forward` (adds what
the config adds to the token embeddings, and gives the rotation attention applies to queries
and keys, bound to the positions it turns by) and `positions_backward`.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache, partial
from typing import Any, NamedTuple

import numpy as np

from sheepop.config.schema import ModelConfig
from sheepop.positional import (
    ROTATED_BY_DIGITS,
    digit_places,
    place_rows,
    sinusoidal_table,
    term_index,
    uses_digits,
)
from sheepop.scratch.rope import Pos, rope_rotate_backward, rope_rotate_forward

Params = dict[str, np.ndarray]


@lru_cache(maxsize=8)
def sinusoidal(n_positions: int, d: int, scale: float, dtype: str) -> np.ndarray:
    """s * P, P the shared sinusoidal table (sheepop.positional), in the model's dtype, computed
    once. s = cfg.sinusoid_scale (1/sqrt(d) by default, so the table does not drown the
    N(0, 0.02) token embeddings)."""
    table = (sinusoidal_table(n_positions, d) * scale).astype(dtype)
    table.setflags(write=False)
    return table


def sinusoidal_positions_forward(params: Params, cfg: ModelConfig, pos: Pos, dtype: np.dtype
                                 ) -> tuple[np.ndarray, None]:
    """out = s * P[pos], a fixed table: nothing to learn, nothing cached."""
    return sinusoidal(cfg.block_size, cfg.n_embd, cfg.sinusoid_scale, np.dtype(dtype).name)[pos], \
        None


class PositionCache(NamedTuple):
    pos: Pos
    n_positions: int


def learned_positions_forward(table: np.ndarray, pos: Pos) -> tuple[np.ndarray, PositionCache]:
    """out = P[pos]: (T, d) for a slice, added to every sequence of the batch; (B, T, d) for
    per-row positions."""
    return table[pos], PositionCache(pos, table.shape[0])


def learned_positions_backward(dout: np.ndarray, cache: PositionCache) -> np.ndarray:
    """dP[p] = sum of dout over every (row, t) at position p (the lookup's adjoint; for a slice,
    the broadcast's adjoint sums over the batch); 0 at positions not used."""
    d = dout.shape[-1]
    dtable = np.zeros((cache.n_positions, d), dtype=dout.dtype)
    if isinstance(cache.pos, slice):
        rows = dtable[cache.pos]
        rows += dout.reshape(-1, len(rows), d).sum(axis=0)
    else:  # one-hot (positions, B T) @ dout (B T, d): np.add.at's sums, as one matmul
        which = cache.pos.reshape(-1)
        onehot = (which[None, :] == np.arange(cache.n_positions)[:, None]).astype(dout.dtype)
        dtable = onehot @ dout.reshape(-1, d)
    return dtable


def digit_rows(idx: np.ndarray, cfg: ModelConfig, pos: Pos, cache: Any = None,
               rng: np.random.Generator | None = None
               ) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The row each token reads (B, T) of each table present: `digit_emb.weight` (A, the digit
    places) min(r_t + o_b, R - 1), r_t its place in its number (0: not a digit)
    (sheepop.positional.digit_places), o_b a random 0 .. model.digit_offset per sequence when
    training (an `rng` given), else 0; `digit_emb.terms` (N, the term indices) min(n_t, S - 1),
    n_t the number the token belongs to (sheepop.positional.term_index). A KV `cache` carries
    each row's (run of digits, numbers ended) to the next call (`cache.digit_run`); left padding
    (per-row `pos`) is not a digit. Also returns what `rope_terms` rotates by, n (B, T), or
    `rope_places`, (n, r) (B, T, 2)."""
    T = idx.shape[-1]
    real = None
    if not isinstance(pos, slice):  # a row's real positions end consecutive; padding is 0
        real = pos == pos[:, -1:] - np.arange(T - 1, -1, -1)
    state = getattr(cache, "digit_run", None) if cache is not None and cache.length else None
    places = digit_places(idx, None if state is None else state[:, 0], real)
    numbers = term_index(idx, state, real)
    if cache is not None:
        cache.digit_run = np.stack([places[:, -1], numbers[:, -1]], axis=-1)
    rows = {}
    if cfg.digit_positions:
        offset = 0
        if rng is not None and cfg.digit_offset:
            offset = rng.integers(0, cfg.digit_offset + 1, size=(idx.shape[0], 1))
        rows["digit_emb.weight"] = place_rows(places, offset, cfg.digit_positions)
    if cfg.term_positions:
        rows["digit_emb.terms"] = np.minimum(numbers, cfg.term_positions - 1)
    if cfg.pos_encoding == "rope_places":
        return rows, np.stack([numbers, places], axis=-1)
    return rows, numbers


def digit_positions_forward(params: Params, rows: dict[str, np.ndarray]
                            ) -> tuple[np.ndarray | float, dict[str, PositionCache]]:
    """out = A[rows_A] + N[rows_N] (B, T, d) for the tables present: lookups, like a learned
    position table read at per-row indices."""
    out: np.ndarray | float = 0.0
    caches = {}
    for name, r in rows.items():
        values, caches[name] = learned_positions_forward(params[name], r)
        out = out + values
    return out, caches


def digit_positions_backward(dout: np.ndarray, caches: dict[str, PositionCache]) -> Params:
    """dA[j] = sum of dout over every (b, t) that read row j (the lookup's adjoint,
    `learned_positions_backward`), for each table."""
    return {name: learned_positions_backward(dout, c) for name, c in caches.items()}


class PositionKind(NamedTuple):
    params: Callable[[ModelConfig], dict[str, tuple[int, ...]]]
    embed_forward: Callable[[Params, ModelConfig, Pos, np.dtype], tuple[np.ndarray, Any]] | None
    embed_backward: Callable[[np.ndarray, Any], Params] | None
    # rotate_forward(qk, pos, cfg) -> (qk, cache), rotate_backward(dqk, cache) -> dqk: the
    # queries and keys stacked on the head axis (B, H + H_kv, T, d_k), turned together
    rotate_forward: Callable | None = None
    rotate_backward: Callable | None = None


POSITIONS = {
    "sinusoidal": PositionKind(lambda cfg: {}, sinusoidal_positions_forward, None),
    "learned": PositionKind(
        lambda cfg: {"pos_emb.weight": (cfg.block_size, cfg.n_embd)},
        lambda params, cfg, pos, dtype: learned_positions_forward(params["pos_emb.weight"], pos),
        lambda dout, cache: {"pos_emb.weight": learned_positions_backward(dout, cache)}),
    "rope": PositionKind(lambda cfg: {}, None, None, rope_rotate_forward, rope_rotate_backward),
    "none": PositionKind(lambda cfg: {}, None, None),
    # RoPE turned by term indices (gpt_forward passes them as the positions)
    "rope_terms": PositionKind(lambda cfg: {}, None, None, rope_rotate_forward,
                               rope_rotate_backward),
    # RoPE turned by (term index, digit place) pairs (rope_angles tells them by their shape)
    "rope_places": PositionKind(lambda cfg: {}, None, None, rope_rotate_forward,
                                rope_rotate_backward),
}


# ----- the unit, as the model sees it -------------------------------------------------------

def position_params(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The positions' parameters in the checkpoint's order: the kind's (pos_emb.weight), then
    the digit places' table A (digit_emb.weight, R x d) and the term indices' N
    (digit_emb.terms, S x d) when their sizes are not 0."""
    shapes = POSITIONS[cfg.pos_encoding].params(cfg)
    if cfg.digit_positions:
        shapes["digit_emb.weight"] = (cfg.digit_positions, cfg.n_embd)
    if cfg.term_positions:
        shapes["digit_emb.terms"] = (cfg.term_positions, cfg.n_embd)
    return shapes


def positions_draw(cfg: ModelConfig) -> bool:
    """Whether the positions draw random numbers while training (the digit places' random
    offset o_b), so that a training step must pass its generator."""
    return bool(cfg.digit_positions and cfg.digit_offset)


class PositionsCache(NamedTuple):
    embed: Any                               # the kind's embed cache (learned: PositionCache)
    embed_backward: Callable | None
    tables: dict[str, PositionCache] | None  # digit places', term indices' lookups


def positions_forward(h: np.ndarray, params: Params, cfg: ModelConfig, idx: np.ndarray,
                      pos: Pos, cache: Any = None, rng: np.random.Generator | None = None
                      ) -> tuple[np.ndarray, tuple[Callable, Callable] | None, PositionsCache]:
    """h = (E[x] + P[pos]) + (A[place] + N[term]), added in place in that order to the token
    embeddings h (`digit_rows`: from the token ids, a KV `cache` carrying each row's state, an
    `rng` drawing the training offsets); the rotation (forward, backward) attention applies,
    bound to what it turns by (`pos`, or rope_terms' / rope_places' term indices and digit
    places; None when the kind turns nothing); and the cache for `positions_backward`."""
    kind = POSITIONS[cfg.pos_encoding]
    embed_cache = tables = None
    if kind.embed_forward is not None:
        values, embed_cache = kind.embed_forward(params, cfg, pos, h.dtype)
        h += values
    if uses_digits(cfg):
        rows, numbers = digit_rows(idx, cfg, pos, cache, rng)
        values, tables = digit_positions_forward(params, rows)
        h += values
        if cfg.pos_encoding in ROTATED_BY_DIGITS:
            pos = numbers  # queries and keys turn by their number (and digit place)
    rotate = None if kind.rotate_forward is None else (
        partial(kind.rotate_forward, pos=pos, cfg=cfg), kind.rotate_backward)
    return h, rotate, PositionsCache(embed_cache, kind.embed_backward, tables)


def positions_backward(dh: np.ndarray, cache: PositionsCache) -> Params:
    """The positions' parameter gradients from dL/dh0: dP (learned), dA and dN (lookups'
    adjoints); the rotation's backward ran inside attention."""
    grads = {} if cache.embed_backward is None else cache.embed_backward(dh, cache.embed)
    if cache.tables is not None:
        grads.update(digit_positions_backward(dh, cache.tables))
    return grads
