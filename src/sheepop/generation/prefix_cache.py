"""Prompt reuse: the keys and values of earlier sequences, kept in blocks and found by prefix.

Attention is causal, so the keys and values of a sequence's first n tokens depend on those n
tokens alone (at positions 0 .. n-1, which every row of sheepop's caches counts from its own
first token: sheepop.generation.running_batch). Any later prompt that starts with the same n
tokens (a conversation's next turn, a shared system prompt, the copies of an `n` > 1 request,
many continuations of one context) may copy them instead of computing them again.

The unit is a block of BLOCK_TOKENS consecutive tokens, as in vLLM's prefix caching, named by a
digest of the whole prefix it ends (the chain h_i = blake2b(h_{i-1} || tokens of block i), h_0
empty): a block is found only behind its own prefix, so a lookup walks the prompt's blocks from
the first and stops at the first one missing. (A radix tree of tokens, as SGLang keeps, reuses
to the exact token; blocks lose up to BLOCK_TOKENS - 1 tokens of a match but cost one dict
lookup per block, a memory bound counted in equal pieces, and no tree to keep balanced; a lost
tail of 15 tokens is 2-3% of the 600-token prompt the reuse starts to matter at.)

Blocks are copied into a request's own cache, never shared (the running batch keeps each row in
contiguous columns), so evicting one never touches a running sequence. Memory is bounded by
`max_bytes`: past it, the least recently used blocks go first. A lookup or a store touches a
prompt's blocks from the last to the first, so within one chain the deeper blocks are always the
older ones and go first: a prefix is never evicted before its extensions, which without it could
not be found. A model whose cache carries per-row state besides keys and values (the digit
places' run of digits) is not cached: the state at a block's end is not kept.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sheepop.arch.kv_cache import KVCache, copied

BLOCK_TOKENS = 16


@dataclass
class Block:
    k: Any  # (n_layer, H_kv, BLOCK_TOKENS, d_k), an array or a tensor of the engine
    v: Any

    @property
    def nbytes(self) -> int:
        return int(self.k.nbytes + self.v.nbytes)


def block_keys(tokens: Sequence[int], blocks: int) -> list[bytes]:
    """The digests h_1 .. h_blocks of the first `blocks` whole blocks of `tokens`."""
    keys, h = [], b""
    ids = np.asarray(list(tokens[:blocks * BLOCK_TOKENS]), dtype=np.int64)
    for i in range(blocks):
        h = hashlib.blake2b(h + ids[i * BLOCK_TOKENS:(i + 1) * BLOCK_TOKENS].tobytes(),
                            digest_size=16).digest()
        keys.append(h)
    return keys


class PrefixCache:
    """Blocks of keys and values by prefix digest, least recently used first, within
    `max_bytes` (0: nothing is kept)."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.blocks: OrderedDict[bytes, Block] = OrderedDict()
        self.nbytes = 0
        self.usable = max_bytes > 0  # (off for good once a cache carries per-row state)
        self.prompt_tokens = 0  # tokens of the prompts looked up, and how many were found
        self.cached_tokens = 0
        self.evicted = 0

    def _touch(self, keys: Sequence[bytes]) -> None:
        for key in reversed(keys):  # the first block ends most recent: it is evicted last
            self.blocks.move_to_end(key)

    def fill(self, tokens: Sequence[int], cache: KVCache) -> int:
        """Copy the longest cached prefix of `tokens`, in whole blocks and shorter than
        `tokens` (the last token's logits are always computed), into row 0 of the empty
        `cache`; the number of tokens it now holds."""
        self.prompt_tokens += len(tokens)
        if not self.usable:
            return 0
        found = []
        for key in block_keys(tokens, (len(tokens) - 1) // BLOCK_TOKENS):
            if key not in self.blocks:
                break
            found.append(key)
        n = len(found) * BLOCK_TOKENS
        if n:
            cache.reserve(n)
            for i, key in enumerate(found):
                block, cols = self.blocks[key], slice(i * BLOCK_TOKENS, (i + 1) * BLOCK_TOKENS)
                cache.k[:, 0, :, cols] = block.k
                cache.v[:, 0, :, cols] = block.v
            cache.length = n
            self._touch(found)
        self.cached_tokens += n
        return n

    def store(self, tokens: Sequence[int], k: Any, v: Any, state: Any = None) -> None:
        """Keep the whole blocks of `tokens`, whose keys and values are k, v (n_layer, H_kv,
        >= len(tokens), d_k) (one row's, from its first token), then evict down to the bound.
        `state`: the row's state besides keys and values (not None: nothing is kept, ever)."""
        if state is not None:
            self.usable = False
            self.clear()
        if not self.usable:
            return
        keys = block_keys(tokens, len(tokens) // BLOCK_TOKENS)
        for i, key in enumerate(keys):
            if key not in self.blocks:
                cols = slice(i * BLOCK_TOKENS, (i + 1) * BLOCK_TOKENS)
                block = Block(copied(k[:, :, cols]), copied(v[:, :, cols]))
                self.blocks[key] = block
                self.nbytes += block.nbytes
        self._touch(keys)
        while self.nbytes > self.max_bytes and self.blocks:
            _, block = self.blocks.popitem(last=False)
            self.nbytes -= block.nbytes
            self.evicted += 1

    def clear(self) -> None:
        self.blocks.clear()
        self.nbytes = 0

    def status(self) -> dict[str, Any]:
        """The figures /health shows and the server logs."""
        rate = self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
        return {"prefix_cache_bytes": self.nbytes, "prefix_cache_max_bytes": self.max_bytes,
                "prefix_cache_blocks": len(self.blocks), "prefix_cache_evicted": self.evicted,
                "prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
                "prefix_cache_hit_rate": round(rate, 4)}
