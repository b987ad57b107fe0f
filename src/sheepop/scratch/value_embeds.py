"""Value embeddings, forward and backward (model.value_embeds;
docs/derivations/value-embeddings.md).

    R_j = T_j[x]                           (B, T, H_kv d_k): a row of table j per token
    v'  = lam v + (1 - lam) R_j            in each layer that reads table j (sheepop.arch.links),
                                           R_j split into the H_kv value heads as v is
    dv = lam dv'     dR_j = (1 - lam) dv'     dlam = sum (v - R_j) . dv'
    dT_j[t] = sum over the positions holding token t of the dR_j of every layer reading T_j

A token's own row reaches the values of early and late layers directly, however the residual
stream has mixed it (modded-nanogpt; the value-residual idea of Zhou et al. 2024). The lookup is
the token embedding's (a row gather, a scatter-add back: sheepop.scratch.layers); the mix is a
weighted sum, so its backward is two scalings and a dot product. Two layers share a table, so
its gradient is the sum of theirs. The attention calls `value_mix_forward` / `_backward` on its
values before the KV cache stores them; `value_embeds_forward` / `_backward` run once per pass
in gpt_forward / gpt_backward. The torch engine's unit is sheepop.model.value_embeds.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from sheepop.arch.links import VALUE_LAMBDAS, VALUE_TABLE, ValueLink, value_links
from sheepop.config.schema import ModelConfig
from sheepop.scratch.layers import embedding_backward, embedding_forward


class ValueMix(NamedTuple):
    """One layer's share: the rows R_j (B, T, H_kv d_k) and its lambda (a 0-d view)."""
    rows: np.ndarray
    lam: np.ndarray


class ValueEmbedsCache(NamedTuple):
    links: list[ValueLink | None]
    lookups: list                # each table's embedding cache
    n_lambdas: int


def value_embeds_forward(params: dict[str, np.ndarray], cfg: ModelConfig, idx: np.ndarray
                         ) -> tuple[list[ValueMix | None], ValueEmbedsCache | None]:
    """Per layer, its `ValueMix` (None where it reads no table); (all None, None) when off."""
    if not cfg.value_embeds:
        return [None] * cfg.n_layer, None
    looked = [embedding_forward(idx, params[VALUE_TABLE.format(j)])
              for j in range(cfg.value_embeds)]
    lambdas = params[VALUE_LAMBDAS]
    links = value_links(cfg)
    mixes = [None if link is None else ValueMix(looked[link.table][0], lambdas[link.mix])
             for link in links]
    return mixes, ValueEmbedsCache(links, [c for _, c in looked], lambdas.shape[0])


def value_embeds_backward(dmixes: list[tuple[np.ndarray, np.ndarray] | None],
                          cache: ValueEmbedsCache | None) -> dict[str, np.ndarray]:
    """The tables' and lambdas' gradients from each layer's (dR, dlam) (None where it reads no
    table): a shared table sums its layers' dR before the scatter-add."""
    if cache is None:
        return {}
    drows: dict[int, np.ndarray] = {}
    dlambdas = None
    for link, dmix in zip(cache.links, dmixes):
        if link is None:
            continue
        dr, dlam = dmix
        drows[link.table] = dr if link.table not in drows else drows[link.table] + dr
        if dlambdas is None:
            dlambdas = np.zeros(cache.n_lambdas, dtype=dr.dtype)
        dlambdas[link.mix] = dlam
    grads = {VALUE_TABLE.format(j): embedding_backward(drows[j], lookup)
             for j, lookup in enumerate(cache.lookups)}
    grads[VALUE_LAMBDAS] = dlambdas
    return grads


def _heads(rows: np.ndarray, like: np.ndarray) -> np.ndarray:
    """(B, T, H_kv d_k) -> (B, H_kv, T, d_k), the layout of the attention's values."""
    B, H, T, dk = like.shape
    return rows.reshape(B, T, H, dk).transpose(0, 2, 1, 3)


def value_mix_forward(v: np.ndarray, mix: ValueMix
                      ) -> tuple[np.ndarray, tuple[np.ndarray, ValueMix]]:
    """v' = lam v + (1 - lam) R for values v (B, H_kv, T, d_k); the cache is (v, mix)."""
    lam = mix.lam.astype(v.dtype)
    return lam * v + (1 - lam) * _heads(mix.rows, v), (v, mix)


def value_mix_backward(dv: np.ndarray, cache: tuple[np.ndarray, ValueMix]
                       ) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """dv, and (dR (B, T, H_kv d_k), dlam) for `value_embeds_backward`."""
    v, mix = cache
    rows = _heads(mix.rows, v)
    lam = mix.lam.astype(dv.dtype)
    dlam = np.vdot(v - rows, dv)
    drows = ((1 - lam) * dv).transpose(0, 2, 1, 3).reshape(mix.rows.shape)
    return lam * dv, (drows, np.asarray(dlam, dtype=dv.dtype))
