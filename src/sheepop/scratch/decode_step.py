"""A decode step of the NumPy engine in few calls: one token through a model whose matrices are
held narrow (`--dtype bfloat16 | int8 | int4`, sheepop.scratch.narrow), the work between the
products compiled (sheepop.scratch.decode_kernels). For each block i:

    a = RMSNorm_1(h)                                      rms_norm_row (add_rms_norm_row after
                                                          the first block: h += the last branch)
    qkv = a W_qkv^T                                       the narrow product
    y = attention(RoPE(q), RoPE(k), v, the cache)         attend_row (k, v written to the cache)
    h += y W_o^T;  f = RMSNorm_2(h)                       add_rms_norm_row
    z = (silu(f W_gate^T) * f W_up^T) W_down^T            two products, silu_mul_row, a product
    logits = RMSNorm_f(h + z) W_head^T  (c tanh(z / c) with a soft cap)

the same formulas as gpt_forward's units (block.py, norm.py, attention.py, rope.py, ffn.py) for
a Llama-family block (`refusal`): about ten calls a block where the NumPy units make ~40 array
operations, each costing its call at one row (docs/performance.md). The logits equal
gpt_forward's within float32's sums (tests/scratch/test_decode_step.py). Everything else (a
prompt, a batch, hooks, steering) runs gpt_forward, and so does any model `refusal` names.
"""

from __future__ import annotations

import numpy as np

from sheepop.arch.kv_cache import KVCache
from sheepop.config.schema import ModelConfig
from sheepop.scratch.decode_kernels import (
    KERNELS,
    add_rms_norm_row,
    attend_row,
    rms_norm_row,
    silu_mul_row,
)
from sheepop.scratch.gpt import token_tables
from sheepop.scratch.narrow import NarrowWeight, compiling
from sheepop.scratch.rope import rope_angles
from sheepop.scratch.softcap import softcap_forward

Params = dict[str, object]

BLOCK_MATRICES = ("attn.qkv", "attn.proj", "ffn.gate", "ffn.up", "ffn.proj")


def refusal(cfg: ModelConfig, params: Params) -> str | None:
    """Why this model's decode steps cannot take the compiled step (gpt_forward then runs them),
    None when they can: a Llama-family block (RMSNorm, RoPE, SwiGLU) with its matrices and head
    narrow, and no parameter but those the step reads (a bias, a value-embedding table, a
    position table, U-net skip weights: each a unit the step does not compute), nor QK-norm
    (which has none)."""
    kinds = {"model.norm": (cfg.norm, "rmsnorm"), "model.ffn": (cfg.ffn, "swiglu"),
             "model.pos_encoding": (cfg.pos_encoding, "rope")}
    for name, (value, needed) in kinds.items():
        if value != needed:
            return f"{name} = {value} (the compiled step computes {needed})"
    if cfg.qk_norm:
        return "model.qk_norm = True (the compiled step has no QK-norm)"
    matrices = [f"blocks.{i}.{m}.weight" for i in range(cfg.n_layer) for m in BLOCK_MATRICES]
    gains = [f"blocks.{i}.{n}.weight" for i in range(cfg.n_layer) for n in ("ln1", "ln2")]
    other = sorted(params.keys() - {"tok_emb.weight", "head.weight", "ln_f.weight", *matrices,
                                    *gains})
    if other:
        return f"{other[0]}: a parameter the compiled step does not read"
    _, head, _ = token_tables(params)
    wide = [n for n in matrices if not isinstance(params[n], NarrowWeight)]
    if wide or not isinstance(head, NarrowWeight):
        return f"{(wide or ['the head'])[0]} is float32 (the compiled step is for narrow weights)"
    return None


class DecodeStep:
    """`step(token, cache)`, step = DecodeStep(cfg, params): the logits (1, V) after one more
    token of a single sequence whose keys and values `cache` holds (B = 1), the cache advanced
    by it: what gpt_forward(params, cfg, [[token]], cache=cache, last_only=True) gives, for a
    model `refusal` accepts."""

    def __init__(self, cfg: ModelConfig, params: Params):
        self.cfg = cfg
        self.table, self.head, _ = token_tables(params)
        self.blocks = [(params[f"blocks.{i}.ln1.weight"], params[f"blocks.{i}.ln2.weight"],
                        *(params[f"blocks.{i}.{m}.weight"] for m in BLOCK_MATRICES))
                       for i in range(cfg.n_layer)]
        self.ln_f = params["ln_f.weight"]
        d = cfg.n_embd
        self.normed = np.empty((1, d), np.float32)  # a norm's output: the next product's rows
        self.heads = np.empty((1, d), np.float32)   # attention's heads side by side
        self.hidden = np.empty((1, cfg.ffn_dim), np.float32)

    def __call__(self, token: int, cache: KVCache) -> np.ndarray:
        cfg, eps = self.cfg, self.cfg.ln_eps
        column, _ = cache.written(1)
        keys = min(cache.length + 1, cache.max_len)  # (a full ring: all of its columns)
        turn = rope_angles(slice(cache.length, cache.length + 1), cfg.head_dim, cfg.rope_theta,
                           np.float32).turn[0]
        cos, sin = np.ascontiguousarray(turn.real), np.ascontiguousarray(turn.imag)
        # (d,): the residual stream, updated in place; the lookup is already a copy of the
        # table's row (fancy indexing, or a narrow table's dequantized rows)
        h = np.ascontiguousarray(self.table[[token]][0], np.float32)
        normed, heads, hidden = self.normed, self.heads, self.hidden
        branch = None  # the last branch's output, added to h by the next norm
        for i, (ln1, ln2, qkv_w, proj_w, gate_w, up_w, down_w) in enumerate(self.blocks):
            if branch is None:
                rms_norm_row(h, ln1, eps, normed[0])
            else:
                add_rms_norm_row(h, branch[0], ln1, eps, normed[0])
            qkv = qkv_w.product(normed)[0]
            attend_row(qkv, cache.k[i, 0], cache.v[i, 0], column, keys, cos, sin, cfg.n_head,
                       heads[0])
            add_rms_norm_row(h, proj_w.product(heads)[0], ln2, eps, normed[0])
            silu_mul_row(gate_w.product(normed)[0], up_w.product(normed)[0], hidden[0])
            branch = down_w.product(hidden)
        add_rms_norm_row(h, branch[0], self.ln_f, eps, normed[0])
        cache.advance(1)
        logits, _ = softcap_forward(self.head.product(normed), cfg.logit_softcap)
        return logits


def warm_step_kernels() -> str | None:
    """Each kernel of the step run once on a small model's numbers (2 heads of 2, 2 keys, one
    key/value head): numba compiles them or loads them from its cache, before the first token
    rather than in it. The start-up line naming what it compiled and how long that took
    (narrow.compiling), or None when all came from the cache."""
    def run() -> None:
        x, out = np.ones(4, np.float32), np.empty(4, np.float32)
        rms_norm_row(x, x, 1e-5, out)
        add_rms_norm_row(x, out, x, 1e-5, out)
        silu_mul_row(x, x, out)
        cache = np.zeros((1, 2, 2), np.float32)
        qkv, turn = np.ones(8, np.float32), np.ones(1, np.float32)
        attend_row(qkv, cache, cache.copy(), 1, 2, turn, turn, 2, out)
    return compiling(KERNELS, run)
