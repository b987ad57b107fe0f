"""The torch engine's side of the shared generation loops (`sheepop.generate`).

`TorchLM` returns next-token logits as NumPy for one sequence (`prefill`/`decode`/`full`, the
`LanguageModel` protocol) or for a batch of left-padded sequences (`prefill_batch`/
`decode_batch`/`full_batch`/`keep_rows`, the `BatchLanguageModel` protocol), always under
`torch.inference_mode` and with a preallocated KV cache (no concatenation per step).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from sheepop.model.batch import left_pad
from sheepop.model.gpt import GPT
from sheepop.model.kv_cache import KVCache


class TorchLM:
    """Next-token logits from a `GPT`, with its preallocated KV cache, under inference_mode.

    `compile=True` runs the forward pass through `torch.compile` (dynamic shapes, so a growing
    cache does not recompile at every step); the first calls pay the compilation.

    On CPU in float32 the blocks' linear weights are re-stored column-major (`decode_layout`):
    same shapes and values, so the model and its checkpoint are unchanged, but y = x W^T then
    reads W^T row by row, the order in which the BLAS library's float32 matrix-vector product
    for a single token runs fastest (12-19% faster decode steps measured here; bfloat16 runs
    fastest row-major, so `cast` puts them back; docs/inference.md).
    """

    def __init__(self, model: GPT, compile: bool = False, decode_layout: bool = True):
        self.model = model.eval()
        self.block_size = model.cfg.block_size
        self.device = next(model.parameters()).device
        self.decode_layout = decode_layout and self.device.type == "cpu"
        _set_layout(model, column_major=self._column_major_pays())
        self.cache = model.new_cache(batch=1)
        self.forward = model
        if compile:
            self.compile()
        # Batch state: a cache of B rows, which key columns hold real tokens, and each row's
        # next position (rows count positions from their own first real token).
        self.batch_cache: KVCache | None = None
        self._key_mask: torch.Tensor | None = None
        self._next_pos: torch.Tensor | None = None
        self._padded = False

    def _column_major_pays(self) -> bool:
        # Measured: float32 products read column-major weights faster, bfloat16 ones row-major.
        return self.decode_layout and self.model.tok_emb.weight.dtype == torch.float32

    def cast(self, dtype: torch.dtype) -> None:
        """Run in `dtype` from now on (weights and KV cache; logits still come out as float32).

        bfloat16 halves the bytes every decode step reads, and a decode step is bound by
        reading the weights: on CPUs with bf16 instructions it is the cheap speed-up."""
        self.model.to(dtype)
        _set_layout(self.model, column_major=self._column_major_pays())
        self.cache = self.model.new_cache(batch=1)
        self.batch_cache = None

    def compile(self) -> None:
        """Run the forward pass through `torch.compile` from now on (dynamic shapes)."""
        self.forward = torch.compile(self.model, dynamic=True)

    @property
    def cache_length(self) -> int:
        return self.cache.length

    def _logits(self, x: torch.Tensor, cache: KVCache | None, **kw) -> np.ndarray:
        with torch.inference_mode():
            logits, _ = self.forward(x, cache=cache, last_only=True, **kw)
        return logits[:, -1].float().cpu().numpy()

    def _run(self, ids: Sequence[int], cache: KVCache | None) -> np.ndarray:
        x = torch.tensor([list(ids)], dtype=torch.long, device=self.device)
        return self._logits(x, cache)[0]

    def prefill(self, ids: Sequence[int]) -> np.ndarray:
        self.cache.reset()
        return self._run(ids, self.cache)

    def decode(self, token: int) -> np.ndarray:
        return self._run([token], self.cache)

    def full(self, ids: Sequence[int]) -> np.ndarray:
        return self._run(ids, None)

    # ----- batches of sequences (left padding) ------------------------------------------------

    @property
    def batch_length(self) -> int:
        """Columns filled in the batch cache (the longest row's length, padding included)."""
        return self.batch_cache.length if self.batch_cache is not None else 0

    def _batch_inputs(self, rows: Sequence[Sequence[int]]) -> tuple[torch.Tensor, dict]:
        idx, pos, real = left_pad(rows, self.device)
        padded = not bool(real.all())
        return idx, ({"pos_ids": pos, "key_mask": real} if padded else {})

    def prefill_batch(self, rows: Sequence[Sequence[int]]) -> np.ndarray:
        """Start a fresh batch cache holding `rows` (left-padded); logits (B, V) after each."""
        idx, kw = self._batch_inputs(rows)
        B, L = idx.shape
        cache = self.batch_cache
        if cache is None or cache.k.shape[1] != B:
            cache = self.batch_cache = self.model.new_cache(batch=B)
        cache.reset()
        self._padded = bool(kw)
        self._key_mask = torch.zeros((B, cache.max_len), dtype=torch.bool, device=self.device)
        self._key_mask[:, :L] = kw["key_mask"] if kw else True
        self._next_pos = torch.tensor([len(r) for r in rows], device=self.device)
        return self._logits(idx, cache, **kw)

    def decode_batch(self, tokens: Sequence[int]) -> np.ndarray:
        """Append one token to every row of the batch cache; logits (B, V) after them."""
        assert self.batch_cache is not None and self._next_pos is not None, "prefill_batch first"
        x = torch.tensor(list(tokens), dtype=torch.long, device=self.device)[:, None]
        end = self.batch_cache.length + 1
        kw = {}
        if self._padded:
            self._key_mask[:, end - 1] = True
            kw = {"pos_ids": self._next_pos[:, None], "key_mask": self._key_mask[:, :end]}
        logits = self._logits(x, self.batch_cache, **kw)
        self._next_pos += 1  # after the forward pass: pos_ids above is a view of it
        return logits

    def full_batch(self, rows: Sequence[Sequence[int]]) -> np.ndarray:
        """Logits (B, V) after the last token of each row, recomputed without a cache."""
        idx, kw = self._batch_inputs(rows)
        return self._logits(idx, None, **kw)

    def keep_rows(self, rows: Sequence[int]) -> None:
        """Keep only these rows of the batch cache (finished sequences leave the batch)."""
        assert self.batch_cache is not None and self._next_pos is not None, "prefill_batch first"
        keep = torch.as_tensor(list(rows), dtype=torch.long, device=self.device)
        cache = self.batch_cache
        cache.k, cache.v = cache.k[:, keep], cache.v[:, keep]
        self._key_mask, self._next_pos = self._key_mask[keep], self._next_pos[keep]


def _set_layout(model: GPT, column_major: bool) -> None:
    """Store every block's linear weight W (out, in) as the row-major W^T it is multiplied by
    (column-major W), or back as the usual row-major W."""
    with torch.no_grad():
        for p in model.blocks.parameters():
            if p.dim() == 2:
                if column_major and not p.t().is_contiguous():
                    p.data = p.data.t().contiguous().t()
                elif not column_major and not p.is_contiguous():
                    p.data = p.data.contiguous()
