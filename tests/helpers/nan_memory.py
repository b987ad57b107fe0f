"""Caches whose fresh memory holds NaN: every KV cache an engine makes while `nan_memory` is
in force gets buffers filled with NaN by its allocation hook, as uninitialised memory may hold.
The engines' hooks allocate without zeroing (sheepop.arch.kv_cache), the cache zeroing what it
does not copy; a column read before it was written or zeroed (a padding column under a mask:
0 * NaN = NaN) then turns logits to NaN, where fresh pages of zeros would have hidden it."""

from __future__ import annotations

import math

import pytest

from sheepop.arch.kv_cache import KVCache


def nan_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """For the rest of the test, KVCache.growing's hook fills every buffer it makes with NaN."""
    growing = KVCache.growing.__func__

    def with_nan(cls, cfg, batch, allocate, max_len=None):
        def allocate_nan(shape):
            buffer = allocate(shape)
            if hasattr(buffer, "fill_"):
                buffer.fill_(math.nan)
            else:
                buffer.fill(math.nan)
            return buffer
        return growing(cls, cfg, batch, allocate_nan, max_len)

    monkeypatch.setattr(KVCache, "growing", classmethod(with_nan))
