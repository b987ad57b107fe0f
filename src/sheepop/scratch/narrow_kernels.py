"""The NumPy engine's products with weights in fewer bytes, compiled by numba (which only this
module and the IR it inlines, sheepop.scratch.row_dot, import; sheepop.scratch.narrow holds the
weights and chooses when to call).

    bf16   y_r,o = sum_i x_r,i float(W_o,i)                 W as bfloat16 bits (uint16, out x in)
    int8   y_r,o = sum_g d_o,g dx_r,g sum_j q xq             q int8 (out x in), GGUF Q8_0
    int4   y_r,o = sum_g (d_o,g dx_r,g sum_j q xq + low_o,g dx_r,g sum_j xq)   q 4-bit, Q4_1

for every row r of x (float32, rows x in), g over blocks of 32 inputs, j < 32. bf16 multiplies x
itself (float(W) is the bits shifted left by 16: exact), summed in float32. int8 and int4
multiply x rounded to 8 bits a block as llama.cpp's Q8_0 and Q8_1 activations are
(`quantize_blocks`), so that each block's 32 products and their sum are exact integer
arithmetic (sheepop.scratch.row_dot); scales and the sums over blocks are float32's, int4's
offsets multiply the rounded x's block sums (so that each product is x~ W~^T, whose errors
cancel over W~'s signs: with x's exact sums, x~ - x met d q >= 0 alone, 2.4x the error on
SmolLM2's activations, +0.0088 bits per byte against +0.0018), and an int8 row's last width
mod 32 inputs (a shorter last block) multiply x in float32.

Why compiled loops: a decode step multiplies one row by each matrix, which reads the matrix once
and is bound by that read (docs/performance.md, "Decode against the memory-bandwidth bound").
NumPy has no bfloat16 and no int8 product (`x @ q` widens q to a float temporary four times its
bytes); these loops widen each weight in registers, and read a row of W from memory once, then
from the cache for every further row of x.

`cache=True` keeps each compiled kernel on disk (numba's cache: beside this file, or a user-wide
folder where that is read-only), so only the first start on a machine compiles (~1 s a kernel).
numba checks only this file's time to find a cached kernel stale: `ROW_DOT_DIGEST` ties the
IR the kernels inline (sheepop.scratch.row_dot) to it.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from sheepop.arch.quantize import GROUP as BLOCK  # inputs a scale of x (and of 4-bit W) covers
from sheepop.scratch.row_dot import float32_of_half, int4_dot, int8_dot

ROW_DOT_DIGEST = "ba9d5497a49e6002"
"""sha256 of sheepop/scratch/row_dot.py, its first 16 hex digits: a change there must change
this file, whose time alone tells numba that the cached kernels inlining that IR are stale
(tests/scratch/test_narrow.py checks the digest)."""

# fastmath, only what vectorising needs: the float32 sums may be reordered into vector lanes
# (reassoc, nsz) and a product and sum fused (contract); NaN and infinity keep their meaning, so
# an overflowing model still gives logits that are not finite, which callers refuse. No bounds
# checks and NumPy's error model: the callers pass checked shapes (sheepop.scratch.narrow).
# parallel: the loop over output rows is shared among numba's threads, `numba.set_num_threads`
# of the launching thread many (sheepop.scratch.narrow sets --threads).
# Each kernel comes twice: `<name>` shares its output rows among threads, `<name>_serial` runs
# them on the calling thread, without a parallel region to start (~1 us of a product's ~2).
_FASTMATH = {"reassoc", "contract", "nsz"}
SERIAL = dict(cache=True, fastmath=_FASTMATH, boundscheck=False, error_model="numpy",
              nogil=True)
_COMPILE = dict(SERIAL, parallel=True)
INLINED = dict(SERIAL, inline="always")  # one output row, written into both forms' loops


@intrinsic
def float32_of_bits(typingctx, bits):
    """The float32 whose bits are `bits` (uint32): a reinterpretation, no arithmetic (LLVM's
    bitcast; NumPy's `.view` for one number, which numba has no spelling of)."""
    def codegen_(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())
    return types.float32(types.uint32), codegen_


@njit(**INLINED)
def bf16_row(bits: np.ndarray, x: np.ndarray, y: np.ndarray, o: int) -> None:
    """y[r, o] = sum_i x[r, i] float(bits[o, i] << 16) for every row r: bits (out, in) uint16,
    x (rows, in) float32, y (rows, out) float32, written in place."""
    for r in range(x.shape[0]):
        acc = np.float32(0.0)
        for i in range(bits.shape[1]):
            acc += x[r, i] * float32_of_bits(np.uint32(bits[o, i]) << np.uint32(16))
        y[r, o] = acc


@njit(**_COMPILE)
def bf16_product(bits: np.ndarray, x: np.ndarray, y: np.ndarray) -> None:
    """y = x float(bits)^T, row by row of bits (`bf16_row`)."""
    for o in prange(bits.shape[0]):
        bf16_row(bits, x, y, o)


@njit(**SERIAL)
def bf16_product_serial(bits: np.ndarray, x: np.ndarray, y: np.ndarray) -> None:
    for o in range(bits.shape[0]):
        bf16_row(bits, x, y, o)


# ---- x in 8 bits a block, and the integer dot products against it ----

@njit(**SERIAL)
def quantize_blocks(x: np.ndarray, blocks: int, halves_paired: bool
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(xq, dx, sums) for the first 32 `blocks` inputs of each row of x (rows, in) float32:
    dx[r, g] = max_j |x[r, 32g + j]| / 127, xq = rint(x / dx) int8 in -127..127 (0 where dx is
    0), sums[r, g] = dx sum_j xq[r, 32g + j] (x~'s block sum: sum_j xq is an exact integer, the
    product rounded once). A block holding NaN or infinity gets dx = NaN, so every
    product it enters is NaN, as x's own would not be finite.

    xq's row holds block g at 32g.. in order, or with `halves_paired` each pair of blocks
    (g, g + 1), g even, as first halves then second halves: x_g[:16], x_g+1[:16], x_g[16:],
    x_g+1[16:] (the order 4-bit pairs read them in, row_dot._row_dot), an odd count's last in
    order."""
    rows = x.shape[0]
    xq = np.empty((rows, BLOCK * blocks), np.int8)
    dx = np.empty((rows, blocks), np.float32)
    sums = np.empty((rows, blocks), np.float32)
    half = BLOCK // 2
    for r in range(rows):
        for g in range(blocks):
            largest = np.float32(0.0)
            finite = True
            for j in range(BLOCK):
                v = x[r, BLOCK * g + j]
                largest = max(largest, abs(v))
                finite = finite and np.isfinite(v)
            inverse = np.float32(127.0) / largest if largest > 0 and finite else np.float32(0.0)
            paired = halves_paired and g < blocks - blocks % 2
            start = BLOCK * (g - g % 2) + half * (g % 2) if paired else BLOCK * g
            total = 0
            for j in range(BLOCK):
                at = start + j % half + BLOCK * (j // half) if paired else start + j
                xq[r, at] = np.int8(np.rint(x[r, BLOCK * g + j] * inverse))
                total += np.int32(xq[r, at])
            dx[r, g] = largest / np.float32(127.0) if finite else np.float32(np.nan)
            sums[r, g] = dx[r, g] * np.float32(total)
    return xq, dx, sums


@njit(**INLINED)
def int8_row(q: np.ndarray, d: np.ndarray, x: np.ndarray, xq: np.ndarray, dx: np.ndarray,
             y: np.ndarray, o: int) -> None:
    """y[r, o] = sum_g d[o, g] dx[r, g] sum_j q[o, 32g + j] xq[r, 32g + j] + d[o, G] sum_i
    x[r, i] q[o, i] over the inputs past the G whole blocks (a shorter last block) for every
    row r: W~ = d q per block of 32 weights of a row (GGUF Q8_0); q (out, in) int8, d
    (out, ceil(in / 32)) float16 bits (uint16), x (rows, in) float32 and xq, dx its 8 bits
    (`quantize_blocks`), y (rows, out) float32, written in place."""
    blocks = dx.shape[1]
    for r in range(x.shape[0]):
        tail = np.float32(0.0)
        for i in range(BLOCK * blocks, q.shape[1]):
            tail += x[r, i] * np.float32(q[o, i])
        if blocks < d.shape[1]:
            tail *= float32_of_half(d[o, blocks])
        y[r, o] = int8_dot(q[o], d[o], xq[r], dx[r]) + tail


@njit(**_COMPILE)
def int8_product(q: np.ndarray, d: np.ndarray, x: np.ndarray, y: np.ndarray) -> None:
    """y = x~ W~^T, W~ = d q a block, x rounded to 8 bits a block (`int8_row`)."""
    xq, dx, _ = quantize_blocks(x, q.shape[1] // BLOCK, False)
    for o in prange(q.shape[0]):
        int8_row(q, d, x, xq, dx, y, o)


@njit(**SERIAL)
def int8_product_serial(q: np.ndarray, d: np.ndarray, x: np.ndarray, y: np.ndarray) -> None:
    xq, dx, _ = quantize_blocks(x, q.shape[1] // BLOCK, False)
    for o in range(q.shape[0]):
        int8_row(q, d, x, xq, dx, y, o)


@njit(**INLINED)
def int4_row(packed: np.ndarray, scale: np.ndarray, low: np.ndarray, xq: np.ndarray,
             dx: np.ndarray, sums: np.ndarray, y: np.ndarray, o: int) -> None:
    """y[r, o] = sum_g (d[o, g] dx[r, g] sum_j q[o, 32g + j] xq[r, 32g + j] + low[o, g]
    sums[r, g]) for every row r: W~ = d q + low per block of 32 weights of a row (GGUF Q4_1),
    q in 0..15; packed (out, 16 G) uint8 (row_dot's order), scale = d and low (out, G)
    float32, xq, dx and sums x~'s numbers (`quantize_blocks`, halves paired), y
    (rows, out) float32, written in place."""
    for r in range(xq.shape[0]):
        y[r, o] = int4_dot(packed[o], scale[o], low[o], xq[r], dx[r], sums[r])


@njit(**_COMPILE)
def int4_product(packed: np.ndarray, scale: np.ndarray, low: np.ndarray, x: np.ndarray,
                 y: np.ndarray) -> None:
    """y = x~ W~^T for x (rows, 32 G) float32, x~ x rounded to 8 bits a block (`int4_row`)."""
    xq, dx, sums = quantize_blocks(x, scale.shape[1], True)
    for o in prange(packed.shape[0]):
        int4_row(packed, scale, low, xq, dx, sums, y, o)


@njit(**SERIAL)
def int4_product_serial(packed: np.ndarray, scale: np.ndarray, low: np.ndarray,
                        x: np.ndarray, y: np.ndarray) -> None:
    xq, dx, sums = quantize_blocks(x, scale.shape[1], True)
    for o in range(packed.shape[0]):
        int4_row(packed, scale, low, xq, dx, sums, y, o)


KERNELS = (bf16_product, bf16_product_serial, int8_product, int8_product_serial,
           int4_product, int4_product_serial, quantize_blocks)
"""Every function of this module numba compiles when called from Python (the rows inline)."""
