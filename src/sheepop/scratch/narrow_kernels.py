"""The NumPy engine's products with weights in fewer bytes, compiled by numba (the one module of
sheepop that imports it; sheepop.scratch.narrow holds the weights and chooses when to call).

    bf16   y_r,o = sum_i x_r,i float(W_o,i)          W as bfloat16 bits (uint16, out x in)
    int8   y_r,o = s_o sum_i x_r,i q_o,i             q int8 (out x in), s float32 (out,)

for every row r of x (float32, rows x in), each sum in float32. A bfloat16 is float32's top 16
bits, so float(W) is the bits shifted left by 16: exact, no rounding. Neither product rounds x:
each is the float32 product of x with the weight's exact float32 value, in another order of
summation than BLAS's.

Why compiled loops: a decode step multiplies one row by each matrix, which reads the matrix once
and is bound by that read (docs/performance.md, "Decode against the memory-bandwidth bound"),
so fewer bytes should mean a faster step. NumPy has no bfloat16 and no int8 product (`x @ q`
widens q to float first, a temporary four times q's bytes); these loops widen each weight in
registers. numba (LLVM) vectorises them (fastmath lets it reorder each float32 sum into vector
lanes): one widened row of W at a time, dotted with every row of x, so W is read once whatever
the rows. Measured on the AVX-512 EPYC, one thread, the 49,152 x 576 head: bf16 29 GB/s and int8
30 GB/s, where OpenBLAS's float32 sgemv read 22 GB/s (docs/performance.md, "Weights in fewer
bytes on the NumPy engine").

`cache=True` keeps each compiled kernel on disk (numba's cache: beside this file, or a user-wide
folder where that is read-only), so only the first start on a machine compiles (~1 s a kernel).
"""

from __future__ import annotations

import numpy as np
from numba import njit

# fastmath: the float32 sums may be reordered into vector lanes (no NaN or infinity is assumed
# away that a finite model gives); no bounds checks and NumPy's error model: the callers pass
# checked shapes (sheepop.scratch.narrow).
_COMPILE = dict(cache=True, fastmath=True, boundscheck=False, error_model="numpy", nogil=True)


@njit(**_COMPILE)
def bf16_product(bits: np.ndarray, x: np.ndarray, y: np.ndarray) -> None:
    """y[r, o] = sum_i x[r, i] float(bits[o, i] << 16): bits (out, in) uint16, x (rows, in)
    float32, y (rows, out) float32, written in place."""
    out, width = bits.shape
    wide = np.empty(width, np.uint32)
    row = wide.view(np.float32)
    for o in range(out):
        for i in range(width):
            wide[i] = np.uint32(bits[o, i]) << 16
        for r in range(x.shape[0]):
            acc = np.float32(0.0)
            for i in range(width):
                acc += x[r, i] * row[i]
            y[r, o] = acc


@njit(**_COMPILE)
def int8_product(q: np.ndarray, scale: np.ndarray, x: np.ndarray,
                 y: np.ndarray) -> None:
    """y[r, o] = scale[o] sum_i x[r, i] q[o, i]: q (out, in) int8, scale (out,) float32, x (rows,
    in) float32, y (rows, out) float32, written in place."""
    out, width = q.shape
    for o in range(out):
        for r in range(x.shape[0]):
            acc = np.float32(0.0)
            for i in range(width):
                acc += x[r, i] * np.float32(q[o, i])
            y[r, o] = acc * scale[o]


KERNELS = (bf16_product, int8_product)
