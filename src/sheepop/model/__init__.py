"""The torch engine: the GPT of docs/architecture.md, with a preallocated KV cache."""

from sheepop.model.gpt import GPT, cross_entropy
from sheepop.model.kv_cache import KVCache

__all__ = ["GPT", "KVCache", "cross_entropy"]
