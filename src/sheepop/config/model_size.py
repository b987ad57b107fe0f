"""How big a model is before it exists: the rule that refuses a config no machine could hold.

A config.json is a user's file, and its numbers decide every allocation that follows
(`block_size = 10**12` asks for a 7 TiB position table, `n_layer = 10**9` for a billion Python
blocks). `check_model_size` runs inside `Config.validate()`, so a config is refused with one
line before anything is allocated. The rule:

    parameters  P = V d (1 + untied) + V head_bias + T d learned + (R + S) d digit places
                    + n d (final norm) + N (V k + 2) (value embeddings) + [L / 2] (U-net)
                    + L (2 n d (two norms) + 2 d^2 + 2 d k (q and proj; k and v)
                         + m d f (the FFN's matrices)
                         + bias (d + 2 k + d (qkv, proj) + b f + d (the FFN's biases)))
    position table  T d        (sinusoidal: a computed buffer; learned: already in P; rope: none)
    KV cache        2 L T k    (keys and values of one sequence of T tokens)
    bytes = 4 (P + T d [sinusoidal] + 2 L T k)        (float32)

with V = vocab_size, d = n_embd, f = d_ff (or its kind's default), T = block_size, L = n_layer,
R = digit_positions and S = term_positions (0: no such table), N = value_embeds (tables of
width k and two lambdas each: sheepop.arch.links), [L / 2] the skip weights with unet_skips,
k = kv_heads * head_dim (= d without grouped-query attention), and what each
layer kind costs from its entry in sheepop.config.layer_kinds: n = NORM_VECTORS[norm]
(layernorm: gain and shift), m and b = FFN_SHAPES[ffn] (mlp: two matrices, one bias of width f). A
model is refused when these bytes exceed the machine's physical memory (`os.sysconf`: page size x
physical pages; a machine that cannot say is taken to have 1 TiB), or when L > MAX_LAYERS
(1024: each block is a few Python objects, so depth costs time and memory beyond its floats;
the deepest published transformers have ~1000 layers). P is exact for the layer kinds that
exist (tests/core/test_hostile_files.py compares it with both engines' parameter lists); a new
kind states its cost in its one line of sheepop.config.layer_kinds.
"""

from __future__ import annotations

import os
from typing import Any

from sheepop.config.layer_kinds import FFN_SHAPES, NORM_VECTORS
from sheepop.errors import UserError

MAX_LAYERS = 1024
FALLBACK_MEMORY = 2**40  # when os.sysconf cannot say (not POSIX)
BYTES_PER_FLOAT = 4


def physical_memory() -> int:
    """This machine's physical memory in bytes (page size x physical pages)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return FALLBACK_MEMORY


def kv_width(m: Any) -> int:
    """k = kv_heads * head_dim: the width of one token's keys (and of its values) per layer."""
    return m.kv_heads * (m.n_embd // m.n_head)


def kv_cache_bytes_per_token(m: Any, itemsize: int = BYTES_PER_FLOAT) -> int:
    """The KV cache's bytes per token of context: 2 L k elements (keys and values, every
    layer); grouped-query attention divides them by n_head / kv_heads."""
    return 2 * m.n_layer * kv_width(m) * itemsize


def describe_kv_cache(m: Any, itemsize: int = BYTES_PER_FLOAT) -> str:
    """'KV cache 2.0 KiB/token (2 of 4 heads)': the line `sheepop train` and `generate` print
    (the heads only when grouped-query attention stores fewer than it queries)."""
    per_token = kv_cache_bytes_per_token(m, itemsize)
    size = f"{per_token} B" if per_token < 1024 else f"{per_token / 1024:,.1f} KiB"
    heads = f" ({m.kv_heads} of {m.n_head} heads)" if m.kv_heads < m.n_head else ""
    return f"KV cache {size}/token{heads}"


def param_count(m: Any) -> int:
    """The number of parameters of a model config (`ModelConfig`), by the formula above."""
    d, V, T, L, k = m.n_embd, m.vocab_size, m.block_size, m.n_layer, kv_width(m)
    f = m.ffn_dim
    n, ffn = NORM_VECTORS[m.norm], FFN_SHAPES[m.ffn]
    per_block = (2 * n * d + 2 * d * d + 2 * d * k + ffn["matrices"] * d * f
                 + (d + 2 * k + d + ffn["biases"] * f + d if m.bias else 0))
    return (V * d * (1 if m.tie_weights else 2) + (V if m.head_bias else 0)
            + (T * d if m.pos_encoding == "learned" else 0)
            + (m.digit_positions + m.term_positions) * d
            + n * d + L * per_block
            + m.value_embeds * (V * k + 2) + (L // 2 if m.unet_skips else 0))


def memory_bytes(m: Any) -> int:
    """Bytes to hold the model for inference: parameters, position table, one sequence's KV
    cache, all float32."""
    T, d = m.block_size, m.n_embd
    table = T * d if m.pos_encoding == "sinusoidal" else 0
    return BYTES_PER_FLOAT * (param_count(m) + table) + T * kv_cache_bytes_per_token(m)


def check_model_size(m: Any, memory: int | None = None) -> None:
    """UserError when the model cannot exist on this machine (`memory`: its bytes, default
    `physical_memory()`). Only call it on a config whose sizes are positive."""
    if m.n_layer > MAX_LAYERS:
        raise UserError(f"model.n_layer is {m.n_layer:,}, more than sheepop builds "
                        f"({MAX_LAYERS})")
    memory = physical_memory() if memory is None else memory
    need = memory_bytes(m)
    if need > memory:
        raise UserError(f"the model would need {need / 2**30:,.1f} GiB ({param_count(m):,} "
                        f"parameters, context {m.block_size:,}, width {m.n_embd:,}, "
                        f"{m.n_layer:,} layers) but this machine has {memory / 2**30:,.1f} GiB "
                        "of memory: check model.* in the config")
