"""sheepop.arch, what both engines share that is not arithmetic: left padding, which keys a query
may see, and the KV cache's bookkeeping (on NumPy buffers; the torch engine's are tensors)."""

import numpy as np
import pytest

from sheepop.arch.batch import allowed_keys, left_pad
from sheepop.arch.kv_cache import KVCache, cache_shape

T, F = True, False


def test_left_pad_positions_and_mask():
    idx, pos, real = left_pad([[4, 5, 6], [7]])
    assert idx.tolist() == [[4, 5, 6], [0, 0, 7]]
    assert pos.tolist() == [[0, 1, 2], [0, 0, 0]]
    assert real.tolist() == [[True, True, True], [False, False, True]]


def test_left_pad_refuses_an_empty_row():
    with pytest.raises(ValueError, match="at least one token"):
        left_pad([[1], []])
    with pytest.raises(ValueError, match="at least one token"):
        left_pad([])


def test_allowed_keys_is_causal_without_a_cache():
    mask = allowed_keys(3, 0)
    assert mask.dtype == bool
    assert mask.tolist() == [[T, F, F],
                             [T, T, F],
                             [T, T, T]]


def test_allowed_keys_after_cached_positions():
    # Queries at positions 3 and 4 see every cached key (0..2) and the keys up to themselves.
    assert allowed_keys(2, 3).tolist() == [[T, T, T, T, F],
                                           [T, T, T, T, T]]
    assert allowed_keys(1, 4).tolist() == [[T, T, T, T, T]]


def test_allowed_keys_of_a_padded_batch():
    _, _, real = left_pad([[4, 5, 6], [7]])
    mask = allowed_keys(3, 0, real)
    assert mask.shape == (2, 1, 3, 3)  # (B, 1, T, past+T): broadcast over the heads
    assert mask[0, 0].tolist() == [[T, F, F],
                                   [T, T, F],
                                   [T, T, T]]
    # Row 1 is [pad, pad, 7]: the padding queries see only themselves (no all-masked row), the
    # real query sees no padding key.
    assert mask[1, 0].tolist() == [[T, F, F],
                                   [F, T, F],
                                   [F, F, T]]


def test_allowed_keys_of_a_padded_batch_decoding_one_token():
    # A decode step after 3 cached columns; the key mask is wider than past+T (the batch's
    # preallocated columns) and is cut to the keys that exist.
    key_mask = np.array([[T, T, T, T, F, F],
                         [F, F, T, T, F, F]])
    mask = allowed_keys(1, 3, key_mask)
    assert mask.shape == (2, 1, 1, 4)
    assert mask[:, 0, 0].tolist() == [[T, T, T, T],
                                      [F, F, T, T]]


def test_cache_shape(small_cfg):
    # small_cfg: 2 layers, 4 heads of 32 / 4 = 8 dimensions, block_size 32.
    assert cache_shape(small_cfg, 3) == (2, 3, 4, 32, 8)
    assert cache_shape(small_cfg, 1, max_len=10) == (2, 1, 4, 10, 8)


def numbered(batch: int, t: int, start: float) -> np.ndarray:
    """(batch, 1 head, t, 2) keys numbered start, start+1, ... so every slot is recognisable."""
    return np.arange(start, start + batch * t * 2, dtype=np.float32).reshape(batch, 1, t, 2)


def new_cache(n_layer: int = 2, batch: int = 2, max_len: int = 4) -> KVCache:
    shape = (n_layer, batch, 1, max_len, 2)
    return KVCache(np.zeros(shape, np.float32), np.zeros(shape, np.float32))


def test_kv_cache_update_stores_after_the_cached_positions_and_advance_moves_on():
    cache = new_cache()
    assert (cache.batch, cache.max_len, cache.length) == (2, 4, 0)
    k, v = cache.update(0, numbered(2, 2, 0), numbered(2, 2, 100))
    assert cache.length == 0  # advance, once every layer has stored its part
    assert k.shape == v.shape == (2, 1, 2, 2)
    assert k[:, 0].tolist() == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
    assert v[:, 0].tolist() == [[[100, 101], [102, 103]], [[104, 105], [106, 107]]]
    assert np.shares_memory(k, cache.k) and np.shares_memory(v, cache.v)  # views, no copies
    cache.update(1, numbered(2, 2, 50), numbered(2, 2, 150))
    cache.advance(2)
    assert cache.length == 2

    k, v = cache.update(0, numbered(2, 1, 10), numbered(2, 1, 110))
    assert k[:, 0].tolist() == [[[0, 1], [2, 3], [10, 11]], [[4, 5], [6, 7], [12, 13]]]
    assert v[:, 0, 2].tolist() == [[110, 111], [112, 113]]
    assert cache.k[1, :, 0, :2].tolist() == [[[50, 51], [52, 53]], [[54, 55], [56, 57]]]
    assert cache.k[0, :, 0, 3].tolist() == [[0, 0], [0, 0]]  # not written yet
    cache.advance(1)
    assert cache.length == 3


def test_kv_cache_keep_rows_keeps_those_rows_in_that_order():
    cache = new_cache(n_layer=1, batch=3)
    cache.update(0, numbered(3, 1, 0), numbered(3, 1, 100))
    cache.advance(1)
    cache.keep_rows([2, 0])
    assert cache.batch == 2 and cache.length == 1
    assert cache.k[0, :, 0, 0].tolist() == [[4, 5], [0, 1]]
    assert cache.v[0, :, 0, 0].tolist() == [[104, 105], [100, 101]]
    k, _ = cache.update(0, numbered(2, 1, 20), numbered(2, 1, 120))
    assert k[:, 0].tolist() == [[[4, 5], [20, 21]], [[0, 1], [22, 23]]]


def test_kv_cache_full_is_a_value_error_and_reset_starts_again():
    cache = new_cache(max_len=4)
    cache.update(0, numbered(2, 3, 0), numbered(2, 3, 0))
    cache.advance(3)
    with pytest.raises(ValueError, match=r"KV cache full: 5 positions > max_len 4"):
        cache.update(0, numbered(2, 2, 0), numbered(2, 2, 0))
    assert cache.length == 3  # the refused update moved nothing
    cache.update(0, numbered(2, 1, 0), numbered(2, 1, 0))  # exactly full is fine
    cache.advance(1)
    cache.reset()
    assert cache.length == 0
    k, _ = cache.update(0, numbered(2, 4, 30), numbered(2, 4, 30))
    assert k.shape == (2, 1, 4, 2) and k[0, 0, 0].tolist() == [30, 31]
