"""A preallocated key/value cache: one (B, H, T_max, d_k) buffer per layer for K and for V.

Generation writes each new position's keys and values in place instead of concatenating, so a
decode step costs one position's work and no reallocation. Memory per token is
2 * n_layer * n_embd * bytes_per_element (K and V, every layer).
"""

from __future__ import annotations

import torch


class KVCache:
    def __init__(self, n_layer: int, batch: int, n_head: int, max_len: int, head_dim: int,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
        shape = (n_layer, batch, n_head, max_len, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.max_len = max_len
        self.length = 0  # positions already stored (same for every layer)

    def reset(self) -> None:
        self.length = 0

    def update(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k_new, v_new (B, H, t, d_k) after the cached positions; return all keys/values.

        The cache length advances in `advance`, once every layer has stored its part.
        """
        start, end = self.length, self.length + k_new.shape[2]
        if end > self.max_len:
            raise ValueError(f"KV cache full: {end} positions > max_len {self.max_len}")
        self.k[layer, :, :, start:end] = k_new
        self.v[layer, :, :, start:end] = v_new
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]

    def advance(self, t: int) -> None:
        self.length += t
