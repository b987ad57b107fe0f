"""Position encodings of the NumPy engine, one per `model.pos_encoding` kind.

A kind acts in one or both of two places (docs/math/03-positions.md):

    embed       h0 = E[x] + P[pos]                      (sinusoidal, learned)
    rotate      q, k -> R(pos) q, R(pos) k per head     (inside attention; none yet)

`pos` is a slice (positions start .. start+T-1 for every row) or an index array (B, T) (each
row of a left-padded batch counts from its own first real token). A `PositionKind` names its
parameters and its forward/backward pairs (None where it does nothing); the torch engine's
units are in sheepop/model/positions.py.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any, NamedTuple

import numpy as np

from sheepop.config import ModelConfig
from sheepop.positional import sinusoidal_table

Pos = slice | np.ndarray
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
    else:
        np.add.at(dtable, cache.pos.reshape(-1), dout.reshape(-1, d))
    return dtable


class PositionKind(NamedTuple):
    params: Callable[[ModelConfig], dict[str, tuple[int, ...]]]
    embed_forward: Callable[[Params, ModelConfig, Pos, np.dtype], tuple[np.ndarray, Any]] | None
    embed_backward: Callable[[np.ndarray, Any], Params] | None
    # rotate_forward(q, k, pos, cfg) -> (q, k, cache); rotate_backward(dq, dk, cache) -> (dq, dk)
    rotate_forward: Callable | None = None
    rotate_backward: Callable | None = None


POSITIONS = {
    "sinusoidal": PositionKind(lambda cfg: {}, sinusoidal_positions_forward, None),
    "learned": PositionKind(
        lambda cfg: {"pos_emb.weight": (cfg.block_size, cfg.n_embd)},
        lambda params, cfg, pos, dtype: learned_positions_forward(params["pos_emb.weight"], pos),
        lambda dout, cache: {"pos_emb.weight": learned_positions_backward(dout, cache)}),
}
