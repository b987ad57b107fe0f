"""How a weight matrix is laid out in memory for decoding, the same rule in both engines.

A decode step multiplies one row x by every weight W (out, in): y = x W^T, a matrix-vector
product that reads W once and is bound by that read. The BLAS libraries stream it at different
rates depending on the order W is stored in (the values and shape never change):

    out >= in   column-major W (W^T row by row: y += x_j W^T[j], y fits in L1)
    out <  in   row-major W    (one dot product of length `in` per output)

Measured on the 2-core AVX2 machine, 1 thread, one row, every matrix its own memory
(SmolLM2's and GPT-2 small's shapes; docs/performance.md, "Decode against the
memory-bandwidth bound"): qkv 960 x 576 15.4 GB/s column-major against 11.0 row-major, gate and
up 1536 x 576 17.1 against 11.3, the tied head 49,152 x 576 19.4 against 15.1; the down
projection 576 x 1536 17.7 row-major against 9.3 column-major.
"""

from __future__ import annotations

from collections.abc import Sequence


def column_major(shape: Sequence[int]) -> bool:
    """Whether a weight of `shape` (out, in) decodes fastest stored column-major."""
    return len(shape) == 2 and shape[0] >= shape[1]
