"""The NumPy engine's side of the generation loops: `NumpyLM`, the arithmetic of a `CachedLM`.

The bookkeeping of caches and left-padded batches is shared (sheepop.generation.cached_lm); the
logits come from the one forward pass of the engine, `gpt_forward`, with its KV cache, except a
single sequence's decode step in a model held narrow, which the compiled step computes
(sheepop.scratch.decode_step: the same formulas in ~10 calls a block, not ~40).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext

import numpy as np

from sheepop.arch.kv_cache import KVCache, slides
from sheepop.arch.layout import column_major
from sheepop.arch.packed import Packed, packs
from sheepop.config.schema import ModelConfig
from sheepop.generation.cached_lm import CachedLM
from sheepop.generation.steering import point_of
from sheepop.scratch.attention import additive
from sheepop.scratch.gpt import gpt_forward, new_cache
from sheepop.scratch.hooks import active, hooked
from sheepop.scratch.init import check_weights
from sheepop.scratch.narrow import NarrowWeight

Params = dict[str, np.ndarray]


def held(w: np.ndarray | NarrowWeight, dtype: type, decode_layout: bool
         ) -> np.ndarray | NarrowWeight:
    """A parameter as the engine holds it: a NarrowWeight as it is; an array in `dtype`, a
    matrix in the order its one-token product reads fastest (sheepop.arch.layout)."""
    if isinstance(w, NarrowWeight):
        return w
    major = decode_layout and column_major(np.shape(w))
    return np.array(w, dtype=dtype, order="F" if major else "C")


class NumpyLM(CachedLM):
    """Next-token logits from the NumPy GPT (float32, or float64 for checks).

    Each matrix W (out, in) is stored in the order OpenBLAS's one-token product reads fastest
    (`decode_layout`, the rule of sheepop.arch.layout: column-major where out >= in): the same
    shape and values, so the same model. A lookup E[x] in a column-major table reads d
    strided values per token: nothing beside the products. A matrix held in fewer bytes
    (sheepop.scratch.narrow, `--dtype bfloat16 | int8 | int4`) is kept as it is.

    Its forward passes raise no floating-point warnings: weights that overflow give logits or
    a loss that are not finite, which every caller refuses in one line or one 4xx
    (sheepop.generation.sample.check_finite, InferenceModel.loss_sum, the server), not
    preceded by NumPy's "RuntimeWarning: overflow" (the torch engine warns of none either)."""

    def __init__(self, cfg: ModelConfig, weights: Params, dtype: type = np.float32,
                 never_generate: Sequence[int] = (), decode_layout: bool = True):
        super().__init__(cfg.block_size, never_generate, slides(cfg))
        self.params = {name: held(weights[name], dtype, decode_layout)
                       for name in check_weights(cfg, weights)}
        self.dtype = np.dtype(dtype)
        self.cfg = cfg
        self.step = self._compiled_step()
        self._new_caches()

    def _compiled_step(self):
        """The compiled decode step (sheepop.scratch.decode_step) for a model held narrow that
        it computes, else None: its module and numba are imported only then."""
        if self.dtype != np.float32 or not any(isinstance(w, NarrowWeight)
                                               for w in self.params.values()):
            return None
        from sheepop.scratch.decode_step import DecodeStep, refusal
        return None if refusal(self.cfg, self.params) else DecodeStep(self.cfg, self.params)

    def _new_cache(self, batch: int, max_len: int | None = None) -> KVCache:
        return new_cache(self.cfg, batch, max_len, self.dtype)

    def _logits(self, idx: np.ndarray, cache: KVCache | None, pos_ids: np.ndarray | None = None,
                key_mask: np.ndarray | None = None, last_only: bool = True) -> np.ndarray:
        if (self.step is not None and idx.shape == (1, 1) and cache is not None
                and cache.batch == 1 and pos_ids is None and key_mask is None
                and not self.additions and active() is None):  # one sequence's next token
            with np.errstate(over="ignore", invalid="ignore"):
                logits = self.step(int(idx[0, 0]), cache)
            return logits if last_only else logits[:, None]
        with np.errstate(over="ignore", invalid="ignore"), self._steered():
            logits, _, _ = gpt_forward(self.params, self.cfg, idx, cache=cache,
                                       pos_ids=pos_ids, key_mask=key_mask, last_only=last_only)
        return logits[:, -1] if last_only else logits

    @property
    def mixes(self) -> bool:
        """(CachedLM.mixes) Not with digit places, whose run of digits is each row's state."""
        return super().mixes and packs(self.cfg)

    def _packed_logits(self, packed: Packed) -> np.ndarray:
        packed.convert_masks(additive)
        with np.errstate(over="ignore", invalid="ignore"), self._steered():
            logits, _, _ = gpt_forward(self.params, self.cfg, packed.idx, cache=packed,
                                       pos_ids=packed.pos, last_only=True)
        return logits[0]

    def _steered(self) -> AbstractContextManager:
        """The pass's steering (`additions`, sheepop.generation.steering): a hook at each
        steered block's output adding its array, in the engine's dtype; none without any."""
        if not self.additions:
            return nullcontext()
        added = {point_of(layer): a.astype(self.dtype) for layer, a in self.additions.items()}
        return hooked(self.cfg, {point: lambda h, p: h + added[p] for point in added})

