"""U-net skip connections across blocks, forward and backward (model.unet_skips;
docs/derivations/skip-connections.md).

    h_i  = block_i(x_i)                       the stream leaving block i
    x_i  = h_(i-1) + w_k h_s                  when block i takes a skip (s, k) (sheepop.arch.links:
                                              s = L-1-i, the mirrored first-half block)
    dh_s += w_k dx_i      dw_k = sum dx_i . h_s      (and dh_(i-1) = dx_i, as without the skip)

The first half's outputs are kept (the cache) and reach the second half directly, past the
blocks between (modded-nanogpt; U-Net, Ronneberger et al. 2015). In the backward pass the
gradient of a kept output is the sum of the one coming back down the stream and the one its skip
sent, which has arrived by then: the skip's target block lies above its source. gpt_forward
calls `skip_forward` before every block and `skip_keep` after it; gpt_backward calls
`skip_kept_backward` before every block's backward and `skip_backward` after it. The torch
engine's unit is sheepop.model.skips.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from sheepop.arch.links import SKIP_WEIGHTS, SkipLink, kept_outputs, skip_links
from sheepop.config.schema import ModelConfig


class SkipsCache(NamedTuple):
    """The links, the weights and the kept outputs h_s (filled as the forward pass goes)."""
    links: list[SkipLink | None]
    keeps: set[int]
    weights: np.ndarray | None
    kept: dict[int, np.ndarray]


def skips_start(params: dict[str, np.ndarray], cfg: ModelConfig) -> SkipsCache:
    """The cache of one forward pass, nothing kept yet (no links without model.unet_skips)."""
    return SkipsCache(skip_links(cfg), kept_outputs(cfg), params.get(SKIP_WEIGHTS), {})


def skip_forward(x: np.ndarray, layer: int, cache: SkipsCache) -> np.ndarray:
    """x + w_k h_s when block `layer` takes a skip (s, k), else x itself."""
    link = cache.links[layer]
    if link is None:
        return x
    return x + cache.weights[link.weight] * cache.kept[link.source]


def skip_keep(h: np.ndarray, layer: int, cache: SkipsCache) -> None:
    """Keep block `layer`'s output when a skip reads it."""
    if layer in cache.keeps:
        cache.kept[layer] = h


def skip_backward(dx: np.ndarray, layer: int, cache: SkipsCache,
                  dkept: dict[int, np.ndarray], dweights: np.ndarray | None) -> None:
    """Through the skip into block `layer`, given dx at its input: w_k dx is sent to h_s
    (`dkept`) and dw_k = sum dx . h_s written into `dweights`; dx itself goes on unchanged."""
    link = cache.links[layer]
    if link is None:
        return
    dkept[link.source] = cache.weights[link.weight] * dx
    dweights[link.weight] = np.vdot(dx, cache.kept[link.source])


def skip_kept_backward(dh: np.ndarray, layer: int, dkept: dict[int, np.ndarray]) -> np.ndarray:
    """dh at block `layer`'s output plus what its skip sent back (when a skip reads it)."""
    return dh + dkept.pop(layer) if layer in dkept else dh
