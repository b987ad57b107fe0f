"""Weights in fewer bytes (docs/performance.md, "Weights in fewer bytes"), the numbers only, in
NumPy: the torch engine's layers that multiply by them are sheepop.model.quantized*, the NumPy
engine's sheepop.scratch.narrow. Three layouts: int8 with one scale per output channel (the
torch engine's int8: its kernel takes one scale a row), below; GGUF Q8_0's blocks of 32 int8
weights (the NumPy engine's int8, `quantize_q8_0`); GGUF Q4_1's 4-bit groups (both engines'
int4, `quantize_groups`).

    s_i = bf16_up(max_j |W_ij| / 127)        one scale per row (output channel) i
    q_ij = round(W_ij / s_i)                  an integer in [-127, 127]
    W_ij ~ s_i q_ij,   |W_ij - s_i q_ij| <= s_i / 2

The scale is rounded *up* to the nearest bfloat16 (`bf16_up`): the CPU's int8 kernel takes
bf16 scales, so storing s in bf16 loses nothing, and rounding up keeps |W_ij / s_i| <= 127 (no
value is clipped, so round-to-nearest's bound s_i / 2 holds for every element). A row of zeros
gets s = 1 and q = 0, exact.

Which weights: the linear layers' (every block's attention and feed-forward matrices) and the
output head, the ones a decode step reads in full. The token embedding is only looked up (one
row a token) and norms, biases and learned positions are small: they stay in float32.
"""

from __future__ import annotations

import numpy as np

QMAX = 127
"""The largest |q|: -128 is left out, so that the range is symmetric and q = -q is exact."""


def bf16_up(x: np.ndarray) -> np.ndarray:
    """The smallest bfloat16 value >= x, for finite x >= 0, as float32: bf16 is float32's top
    16 bits, so clear the low 16 and add one bf16 step where that lost anything."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    kept = bits & np.uint32(0xFFFF0000)
    up = np.where(kept != bits, kept + np.uint32(0x10000), kept).astype(np.uint32)
    return up.view(np.float32)


def bf16_bits(w: np.ndarray) -> np.ndarray:
    """bfloat16(W) as its 16 bits (uint16), rounded to nearest, ties to even: the top half of
    float32's bits after adding 0x7FFF plus the kept half's lowest bit (what torch's
    `.to(torch.bfloat16)` gives for finite values)."""
    bits = np.ascontiguousarray(w, dtype=np.float32).view(np.uint32)
    rounded = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return (rounded >> np.uint32(16)).astype(np.uint16)


def bf16_values(bits: np.ndarray) -> np.ndarray:
    """The float32 values of bfloat16 bits (uint16): the bits shifted into float32's top half
    (exact: bfloat16 is the top half of a float32)."""
    return (np.asarray(bits).astype(np.uint32) << np.uint32(16)).view(np.float32)


def quantize_rows(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(q int8 (out, in), s float32 (out,)) with W ~ s[:, None] * q: the rules above."""
    w = np.asarray(w, dtype=np.float32)
    if w.ndim != 2:
        raise ValueError(f"int8 quantization takes a matrix (out, in), not shape {w.shape}")
    peak = np.abs(w).max(axis=1)
    scale = bf16_up(np.where(peak > 0, peak / QMAX, 1.0).astype(np.float32))
    q = np.clip(np.rint(w / scale[:, None]), -QMAX, QMAX).astype(np.int8)
    return q, scale


def dequantize_rows(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """s[:, None] * q in float32."""
    return q.astype(np.float32) * np.asarray(scale, dtype=np.float32)[:, None]


GROUP = 32
"""Weights per group in the 4-bit layout: GGUF's Q4_1 block (and Q8_0's)."""

CHUNK = 2 ** 16
"""Weights quantize_q8_0 takes at a time (256 KiB of float32): its steps' temporaries then stay
in the cache: SmolLM2's 134M weights in 0.42-0.44 s, against 0.7-1.1 s whole and 0.50-0.76 s in
chunks of 2^14 or 2^12 (quantize_rows, a scale a row: 0.19 s)."""


def quantize_groups(w: np.ndarray, group: int = GROUP
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """GGUF Q4_1's layout, per group of `group` consecutive weights of a row:

        low = min_j W_j,  d = (max_j W_j - low) / 15,  q_j = round((W_j - low) / d) in [0, 15]
        W_j ~ low + d q_j,   |W_j - (low + d q_j)| <= d / 2

    Returns (q uint8 (out, in), d float32 (out, in / group), low float32 (out, in / group)).
    A matrix dequantized from Q4_1 blocks gives back its blocks (the block's smallest weight is
    `low`, its largest low + 15 d), so a model imported from such a file runs on its own
    4-bit numbers."""
    w = np.asarray(w, dtype=np.float32)
    out, width = w.shape
    if width % group:
        raise ValueError(f"4-bit groups of {group} need a width that is a multiple of it, "
                         f"not {width}")
    g = w.reshape(out, width // group, group)
    low, high = g.min(axis=2), g.max(axis=2)
    d = np.where(high > low, (high - low) / 15, 1.0).astype(np.float32)
    q = np.clip(np.rint((g - low[..., None]) / d[..., None]), 0, 15).astype(np.uint8)
    return q.reshape(out, width), d, low


def dequantize_groups(q: np.ndarray, d: np.ndarray, low: np.ndarray,
                      group: int = GROUP) -> np.ndarray:
    """low + d q, group by group, in float32 (out, in)."""
    out, width = q.shape
    g = q.reshape(out, width // group, group).astype(np.float32)
    return (low[..., None] + d[..., None] * g).reshape(out, width)


def quantize_q8_0(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """GGUF Q8_0's numbers, per block of 32 consecutive weights of a row (a width that is not a
    multiple of 32: the rest of the row, a shorter last block):

        d = max_j |W_j| / 127,  q_j = roundf(W_j (1 / d)) in [-127, 127],  d kept as float16
        W_j ~ d16 q_j,   |W_j - d16 q_j| <= d / 2 + 127 |d - d16|

    in float32, rounding halves away from zero, as ggml's quantize_row_q8_0 does (so a matrix
    whose width is a multiple of 32 gives the bytes `gguf.quants.quantize(W, Q8_0)` writes:
    sheepop's `export --to gguf --gguf-type q8_0` and llama.cpp run these numbers). A block of
    zeros gets d = 0 and q = 0, exact. A matrix dequantized from Q8_0 blocks gives back its
    blocks (127 |q| is the largest of a block ggml made, d16 127 / 127 = d16 exactly in
    float32), so a model imported from such a file runs on its own 8-bit numbers. A block whose
    scale float16 cannot hold (a weight past 127 x 65504, or not finite) is a ValueError.

    Returns (q int8 (out, in), d float16 (out, ceil(in / 32)))."""
    w = np.asarray(w, dtype=np.float32)
    if w.ndim != 2:
        raise ValueError(f"Q8_0 quantization takes a matrix (out, in), not shape {w.shape}")
    out, width = w.shape
    blocks = -(-width // GROUP)
    q = np.empty((out, blocks * GROUP), np.int8)
    d = np.empty((out, blocks), np.float32)
    rows = max(1, CHUNK // (blocks * GROUP))  # a chunk's temporaries stay in the cache
    for start in range(0, out, rows):
        g = w[start:start + rows]
        if width % GROUP:  # a shorter last block: zeros change no block's largest
            g = np.pad(g, ((0, 0), (0, blocks * GROUP - width)))
        g = g.reshape(len(g), blocks, GROUP)
        scaled = np.abs(g)
        chunk_d = d[start:start + rows]
        np.divide(scaled.max(axis=2), np.float32(QMAX), out=chunk_d)
        held = chunk_d <= np.finfo(np.float16).max  # False for NaN too
        if not held.all():
            raise ValueError(f"Q8_0 keeps each block's scale max |W| / 127 in float16 (at "
                             f"most 65504): a block's largest weight is "
                             f"{QMAX * chunk_d[~held][0]:.3g}")
        inverse = np.divide(np.float32(1), chunk_d, out=np.zeros_like(chunk_d),
                            where=chunk_d > 0)
        scaled *= inverse[..., None]  # |W (1 / d)|, as ggml rounds it
        whole = np.floor(scaled)  # roundf: a fraction of exactly 1/2 goes up; floor(a + 1/2)
        scaled -= whole           # would round 0.49999997 up too
        scaled *= 2
        np.floor(scaled, out=scaled)
        scaled += whole
        q[start:start + rows] = np.copysign(scaled, g, out=scaled).reshape(len(g), -1)
    return np.ascontiguousarray(q[:, :width]), d.astype(np.float16)


def dequantize_q8_0(q: np.ndarray, d: np.ndarray) -> np.ndarray:
    """d16 q, block by block along the last axis, in float32 (q (..., in), d (..., blocks): a
    matrix, or rows of one)."""
    scales = np.repeat(np.asarray(d).astype(np.float32), GROUP, axis=-1)[..., :q.shape[-1]]
    return q.astype(np.float32) * scales
