"""Which layers are linked across the stack, the same in both engines: value embeddings shared
by early and late layers (model.value_embeds), and the U-net's skips from the first half's
blocks to the mirrored second half (model.unet_skips). Bookkeeping only; the arithmetic is each
engine's unit (docs/derivations/value-embeddings.md, docs/derivations/skip-connections.md).

    value embeddings, N tables over L layers:   layer i reads table i        for i < N
                                                layer L-N+j reads table j    for j < N
                                                (the rest none: modded-nanogpt's 012 ... 012)
    lambda k belongs to the k-th layer that reads a table (in layer order)
    skips, L layers, S = L // 2:                block L-1-i takes block i's output, i < S,
                                                weighted by skip k = i' - (L - S), i' = L-1-i
                                                (an odd L's middle block takes none)
"""

from __future__ import annotations

from typing import NamedTuple

from sheepop.config.schema import ModelConfig

VALUE_TABLE = "value_embeds.{}.weight"
VALUE_LAMBDAS = "value_embeds.lambdas"
SKIP_WEIGHTS = "skips.weights"


class ValueLink(NamedTuple):
    """A layer that mixes value embeddings into its values: v <- lam v + (1 - lam) T[x],
    with T = table `table` and lam = lambdas[`mix`]."""
    table: int
    mix: int


class SkipLink(NamedTuple):
    """A block whose input gains weights[`weight`] times block `source`'s output."""
    source: int
    weight: int


def value_links(cfg: ModelConfig) -> list[ValueLink | None]:
    """Per layer, its value embedding table and lambda, or None. 2N <= L (a config rule), so
    no layer reads two tables."""
    L, N = cfg.n_layer, cfg.value_embeds
    tables = [i if i < N else i - (L - N) if i >= L - N else None for i in range(L)]
    links: list[ValueLink | None] = []
    for table in tables:
        links.append(None if table is None else
                     ValueLink(table, sum(link is not None for link in links)))
    return links


def skip_links(cfg: ModelConfig) -> list[SkipLink | None]:
    """Per block, the first-half block whose output its input gains, or None (every block
    without model.unet_skips)."""
    L = cfg.n_layer
    S = L // 2 if cfg.unet_skips else 0
    return [SkipLink(L - 1 - i, i - (L - S)) if i >= L - S else None for i in range(L)]


def kept_outputs(cfg: ModelConfig) -> set[int]:
    """The blocks whose outputs a skip reads (the first half's)."""
    return {link.source for link in skip_links(cfg) if link is not None}


def link_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The parameters the links add: N value tables (V, H_kv d_k), as wide as the values they
    mix into, their 2N lambdas, and the L // 2 skip weights."""
    shapes: dict[str, tuple[int, ...]] = {}
    if cfg.value_embeds:
        width = cfg.kv_heads * cfg.head_dim
        shapes.update({VALUE_TABLE.format(j): (cfg.vocab_size, width)
                       for j in range(cfg.value_embeds)})
        shapes[VALUE_LAMBDAS] = (sum(link is not None for link in value_links(cfg)),)
    if cfg.unet_skips and cfg.n_layer // 2:
        shapes[SKIP_WEIGHTS] = (cfg.n_layer // 2,)
    return shapes
