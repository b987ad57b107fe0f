"""The NumPy engine's products with weights in fewer bytes, compiled by numba (the one module of
sheepop that imports it; sheepop.scratch.narrow holds the weights and chooses when to call).

    bf16   y_r,o = sum_i x_r,i float(W_o,i)          W as bfloat16 bits (uint16, out x in)
    int8   y_r,o = s_o sum_i x_r,i q_o,i             q int8 (out x in), s float32 (out,)
    int4   y_r,o = sum_g d_o,g sum_j x q + low_o,g sum_j x    4-bit q per group of 32 (Q4_1)

for every row r of x (float32, rows x in), each sum in float32. A bfloat16 is float32's top 16
bits, so float(W) is the bits shifted left by 16: exact, no rounding. No product rounds x:
each is the float32 product of x with the weight's exact float32 value, in another order of
summation than BLAS's.

Why compiled loops: a decode step multiplies one row by each matrix, which reads the matrix once
and is bound by that read (docs/performance.md, "Decode against the memory-bandwidth bound"),
so fewer bytes should mean a faster step. NumPy has no bfloat16 and no int8 product (`x @ q`
widens q to float first, a temporary four times q's bytes); these loops widen each weight in
registers. numba (LLVM) vectorises them (fastmath lets it reorder each float32 sum into vector
lanes); a row of W is read from memory once, then from the cache for every further row of x.
Measured on the AVX-512 EPYC, one thread, the 49,152 x 576 head: bf16 36 GB/s and int8 30 GB/s,
where OpenBLAS's float32 sgemv read 22 GB/s (docs/performance.md, "Weights in fewer bytes on
the NumPy engine"). (bf16 first widened each row into a float32 buffer, then took the dot
product: 29 GB/s; widening in registers needs `float32_of_bits`.)

`cache=True` keeps each compiled kernel on disk (numba's cache: beside this file, or a user-wide
folder where that is read-only), so only the first start on a machine compiles (~1 s a kernel).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

# fastmath, only what vectorising needs: the float32 sums may be reordered into vector lanes
# (reassoc, nsz) and a product and sum fused (contract); NaN and infinity keep their meaning, so
# an overflowing model still gives logits that are not finite, which callers refuse. No bounds
# checks and NumPy's error model: the callers pass checked shapes (sheepop.scratch.narrow).
# parallel: the loop over output rows (tiles, for 4 bits) is shared among numba's threads,
# `numba.set_num_threads` of the launching thread many (sheepop.scratch.narrow sets --threads).
_COMPILE = dict(cache=True, fastmath={"reassoc", "contract", "nsz"}, boundscheck=False,
                error_model="numpy", nogil=True, parallel=True)


@intrinsic
def float32_of_bits(typingctx, bits):
    """The float32 whose bits are `bits` (uint32): a reinterpretation, no arithmetic (LLVM's
    bitcast; NumPy's `.view` for one number, which numba has no spelling of)."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())
    return types.float32(types.uint32), codegen


@njit(**_COMPILE)
def bf16_product(bits: np.ndarray, x: np.ndarray, y: np.ndarray) -> None:
    """y[r, o] = sum_i x[r, i] float(bits[o, i] << 16): bits (out, in) uint16, x (rows, in)
    float32, y (rows, out) float32, written in place."""
    out, width = bits.shape
    for o in prange(out):
        for r in range(x.shape[0]):
            acc = np.float32(0.0)
            for i in range(width):
                acc += x[r, i] * float32_of_bits(np.uint32(bits[o, i]) << np.uint32(16))
            y[r, o] = acc


@njit(**_COMPILE)
def int8_product(q: np.ndarray, scale: np.ndarray, x: np.ndarray,
                 y: np.ndarray) -> None:
    """y[r, o] = scale[o] sum_i x[r, i] q[o, i]: q (out, in) int8, scale (out,) float32, x (rows,
    in) float32, y (rows, out) float32, written in place."""
    out, width = q.shape
    for o in prange(out):
        for r in range(x.shape[0]):
            acc = np.float32(0.0)
            for i in range(width):
                acc += x[r, i] * np.float32(q[o, i])
            y[r, o] = acc * scale[o]


@njit(**_COMPILE)
def int4_product(packed: np.ndarray, scale: np.ndarray, low: np.ndarray, x: np.ndarray,
                 y: np.ndarray) -> None:
    """y[r, o] = sum_g (d[o, g] sum_j x[r, 32g + j] q[o, 32g + j] + low[o, g] sum_j x[r, 32g + j]),
    j < 32: W~ = d q + low per group of 32 weights of a row (GGUF Q4_1), q in [0, 15].

    The layout (sheepop.scratch.narrow.Int4Weight): rows in tiles of R, each tile's R x G
    groups side by side as "lanes" l = k G + g (row k of the tile, group g):
        packed (tiles, 16, R G) uint8   byte [t, j, l]: q at input 32g + j (low 4 bits) and at
                                         32g + 16 + j (high 4 bits) of row tR + k
        scale, low (tiles, R G) float32 d and low of each group
    x (rows, 32 G) float32, y (rows, tiles R) float32, written in place.

    Why lanes: each group's dot product is 32 long, so summing it alone ends in a horizontal sum
    across a vector every 32 weights, and LLVM then vectorised the group loop worst of all
    (measured: 4-6 ms for the 49,152 x 576 head). With groups as lanes every step is one long
    vector loop over l: sum_j runs in R G independent lanes at once, and the scales apply once
    per group at the end (1.3 ms). numba widens integer arithmetic to int64, whose conversions
    to float32 take twice the instructions: `np.uint8(b >> 4)` narrows the high half back, so
    LLVM converts 16 lanes at once (measured: 12 GB/s over a model's matrices, against 9.5
    with the halves taken apart in float32)."""
    tiles, _, lanes = packed.shape
    groups = x.shape[1] // 32
    per_tile = lanes // groups
    rows = x.shape[0]
    # x laid out as the lanes: sum_j x_j q_j = sum_j first_j b_j + second_j (b_j >> 4), where
    # the byte b_j = q_j + 16 q'_j holds q_j (input 32g + j) and q'_j (input 32g + 16 + j),
    # first_j = x[32g + j] and second_j = x[32g + 16 + j] - 16 x[32g + j]
    first = np.empty((rows, 16, lanes), np.float32)
    second = np.empty((rows, 16, lanes), np.float32)
    total = np.zeros((rows, groups), np.float32)  # sum_j x[32g + j], for the offsets
    for r in range(rows):
        for g in range(groups):
            for j in range(32):
                total[r, g] += x[r, 32 * g + j]
            for j in range(16):
                for k in range(per_tile):
                    first[r, j, k * groups + g] = x[r, 32 * g + j]
                    second[r, j, k * groups + g] = (x[r, 32 * g + 16 + j]
                                                    - np.float32(16.0) * x[r, 32 * g + j])
    for t in prange(tiles):
        sums = np.empty(lanes, np.float32)  # each thread's own
        for r in range(rows):
            for lane in range(lanes):
                sums[lane] = 0.0
            for j in range(16):
                for lane in range(lanes):
                    b = packed[t, j, lane]
                    sums[lane] += (first[r, j, lane] * np.float32(b)
                                   + second[r, j, lane] * np.float32(np.uint8(b >> 4)))
            for k in range(per_tile):
                acc = np.float32(0.0)
                for g in range(groups):
                    lane = k * groups + g
                    acc += scale[t, lane] * sums[lane] + low[t, lane] * total[r, g]
                y[r, t * per_tile + k] = acc
