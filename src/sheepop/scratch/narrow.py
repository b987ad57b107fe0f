"""Weights in fewer bytes in the NumPy engine, `--dtype bfloat16 | int8 | int4`
(docs/performance.md, "Weights in fewer bytes on the NumPy engine").

    bfloat16   W~ = bf16(W), round to nearest even        2 bytes a weight
    int8       W~ = d q per block of 32, q in -127..127     17/16 byte a weight (d float16)
               (GGUF Q8_0's numbers, arch.quantize.quantize_q8_0)
    int4       W~ = d q + low per block of 32, q in 0..15   3/4 byte a weight (d, low float32)
               (GGUF Q4_1's numbers, arch.quantize.quantize_groups; the head in int8)

Both hold a GGUF file's own blocks (Q4_1's float16 d and low kept in float32, exactly) and give
llama.cpp's numbers for the same float32 matrix. The torch engine's int8 differs: one
scale a row (sheepop.model.quantized; torch's int8 kernel takes no other).

A `NarrowWeight` stands where the float32 matrix W (out, in) stood in the engine's parameters,
and the layers do not change: `x @ W.T` (linear_forward) is the product below, `W[ids]` (a tied
head's table, looked up) the rows of W~, both in float32. Up to `kernel_rows` rows go through
the compiled kernels of sheepop.scratch.narrow_kernels (a decode step: W read once, in its own
bytes), more (a prompt) through OpenBLAS on W~ widened to float32, which reads more bytes but
uses each for many rows. Both compute the same numbers, in another order of float32 sums:

    bfloat16   x W~^T                        x itself (widening bf16 is exact)
    int8       x~ W~^T                       x~: x rounded to 8 bits a block of 32 inputs
    int4       x~ W~^T

x~ = dx xq, dx = max |x| / 127 over the block, xq = rint(x / dx) (narrow_kernels'
quantize_blocks; the last width mod 32 inputs stay x), as llama.cpp rounds x for its Q8_0 and
Q4_1 products: the kernels' sums over a block are then exact integer arithmetic. A prompt and
its decode steps thus give the same logits (up to float32's sums), and bits per byte measured
on a prompt is the decode's quality. Rows in float64 (a reference) multiply W~ as they are.

Which matrices: every linear layer's in the blocks and the head's (for a tied head, the token
table: its lookups then read W~'s rows, as llama.cpp's do). Norms, biases, position and
value-embedding tables stay float32: they are a small part of a step's bytes.

The kernels share their output rows among `--threads` threads, one kernel at a time
(`launch`). Their module is imported when first used (`warm_kernels` at build, or a product),
not here: numba takes ~0.25 s to import, which the float32 engine (that imports this module)
never pays.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Mapping, MutableMapping

import numpy as np

from sheepop import threads
from sheepop.arch.params import uses_muon
from sheepop.arch.quantize import (
    GROUP,
    bf16_bits,
    bf16_values,
    dequantize_groups,
    dequantize_q8_0,
    quantize_groups,
    quantize_q8_0,
)
from sheepop.errors import UserError

KERNEL_ROWS = 16
"""The most rows a bf16 product takes through its kernel (`NarrowWeight.kernel_rows`); more go
through OpenBLAS on the widened matrix, which must first be written out in float32. Measured on
the AVX-512 EPYC, 1 thread, the 49,152 x 576 head: the kernel 18.6 ms at 16 rows against
widening and OpenBLAS's 35.4, 68 against 55 at 64; a whole SmolLM2 prompt of 48 tokens 181 ms
with this bound, 215 with 128."""

INTEGER_KERNEL_ROWS = 128
"""The same bound for int8 and int4, whose kernels multiply 32 weights in a few integer
instructions: on the head 8.8-8.9 ms at 16 rows against OpenBLAS's 44-50, 34 against 68-76 at
64; whole SmolLM2 prompts (one thread), this bound against 16: 24 tokens 68 ms against 141-180,
96 tokens 275-278 against 369-439, 128 tokens 474-494 against 614-725; at 192 tokens (OpenBLAS
past the bound in both) the same."""

_LAUNCH = threading.Lock()
"""One parallel kernel runs at a time in a process: numba's fallback threading layer
(workqueue, where no OpenMP or TBB runtime is found) aborts the process when two threads launch
parallel loops at once, as a server's model thread and another caller could."""
_SET = threading.local()  # n: the count this Python thread last gave numba; auto: auto's


def kernels():
    """sheepop.scratch.narrow_kernels, imported at the first call (an import statement per
    product cost a microsecond, 150 times a token)."""
    module = sys.modules.get("sheepop.scratch.narrow_kernels")
    if module is None:
        from sheepop.scratch import narrow_kernels as module
    return module


def launch(name: str, *arrays: np.ndarray) -> None:
    """The kernel `name`(*arrays) on the threads sheepop.threads set: on one, its serial form on
    the calling thread; on more, numba's count set for the launching thread (numba keeps one
    per thread, so each thread that computes sets its own; at most numba's pool,
    NUMBA_NUM_THREADS)."""
    n = threads.applied()
    if n is None:  # no thread count set (a library caller): auto's, found once a thread
        n = getattr(_SET, "auto", None)
        if n is None:
            n = _SET.auto = threads.current()  # (it reads the load average: not every time)
    module = kernels()
    if n <= 1:
        getattr(module, name + "_serial")(*arrays)
        return
    numba = sys.modules["numba"]  # loaded with the kernels' module
    n = min(n, numba.config.NUMBA_NUM_THREADS)
    with _LAUNCH:
        if getattr(_SET, "n", None) != n:
            numba.set_num_threads(n)
            _SET.n = n
        getattr(module, name)(*arrays)


def in_8_bits(x: np.ndarray) -> np.ndarray:
    """x (rows, in) float32 rounded to 8 bits a block of 32 inputs as the kernels round it, in
    float32 (dx xq; past the last whole block x itself: module docstring)."""
    blocks = x.shape[1] // GROUP
    xq, dx, _ = kernels().quantize_blocks(x, blocks, False)
    rounded = x.copy()
    rounded[:, :GROUP * blocks] = (xq.reshape(len(x), blocks, GROUP)
                                   * dx[..., None]).reshape(len(x), -1)
    return rounded


class NarrowWeight:
    """A matrix W~ (out, in) held in fewer bytes; `x @ w.T` and `w[ids]` give float32, as the
    float32 array of W~'s values would (module docstring)."""

    __array_ufunc__ = None  # `x @ w.T` comes to _Transposed.__rmatmul__, not to NumPy's matmul
    dtype = np.dtype(np.float32)  # the type of every number it gives
    ndim = 2
    kernel_rows = KERNEL_ROWS  # the most rows a product takes through the kernel
    rounds_x = False  # whether the product multiplies x rounded to 8 bits a block (x~)

    def __init__(self, shape: tuple[int, int]):
        self.shape = shape
        self._transposed = _Transposed(self)  # made once: a decode step asks for it 150 times

    @property
    def T(self) -> _Transposed:
        return self._transposed

    def dequantized(self) -> np.ndarray:
        """W~ as a float32 array (out, in)."""
        raise NotImplementedError

    def product(self, x: np.ndarray) -> np.ndarray:
        """The product (module docstring) for x (rows, in) float32, rows <= kernel_rows,
        through the kernel."""
        raise NotImplementedError

    def wide_product(self, x: np.ndarray) -> np.ndarray:
        """The same product for any number of rows, through OpenBLAS on W~ in float32."""
        return (in_8_bits(x) if self.rounds_x else x) @ self.dequantized().T

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        w = self.dequantized()
        return w if dtype is None else w.astype(dtype)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(shape={self.shape}, {self.nbytes:,} bytes)"


class _Transposed:
    """W~^T, only to stand on the right of `@`: y = x W~^T."""

    __array_ufunc__ = None

    def __init__(self, weight: NarrowWeight):
        self.weight = weight
        self.shape = weight.shape[::-1]

    def __rmatmul__(self, x: np.ndarray) -> np.ndarray:
        w = self.weight
        if x.ndim != 2 or x.shape[1] != w.shape[1]:
            raise ValueError(f"x of shape {x.shape} cannot multiply W^T of shape {self.shape}")
        if x.dtype != np.float32:
            return x @ w.dequantized().astype(x.dtype).T
        x = np.ascontiguousarray(x)
        return w.product(x) if len(x) <= w.kernel_rows else w.wide_product(x)


class Bf16Weight(NarrowWeight):
    """W~ = bf16(W), held as its bits."""

    def __init__(self, w: np.ndarray):
        super().__init__(np.shape(w))
        self.bits = bf16_bits(w)
        self.nbytes = self.bits.nbytes

    def dequantized(self) -> np.ndarray:
        return bf16_values(self.bits)

    def product(self, x: np.ndarray) -> np.ndarray:
        y = np.empty((x.shape[0], self.shape[0]), np.float32)
        launch("bf16_product", self.bits, x, y)
        return y

    def __getitem__(self, ids) -> np.ndarray:
        return bf16_values(self.bits[ids])


class Int8Weight(NarrowWeight):
    """W~ = d q per block of 32 weights of a row, q int8 (out, in), d float16 (out,
    ceil(in / 32)): GGUF Q8_0's numbers as it stores them (sheepop.arch.quantize.quantize_q8_0;
    a width not a multiple of 32 ends in a shorter block)."""

    kernel_rows = INTEGER_KERNEL_ROWS
    rounds_x = True

    def __init__(self, w: np.ndarray):
        super().__init__(np.shape(w))
        self.q, self.scale = quantize_q8_0(w)
        self._scale_bits = self.scale.view(np.uint16)  # as the kernel reads them
        self.nbytes = self.q.nbytes + self.scale.nbytes

    def dequantized(self) -> np.ndarray:
        return dequantize_q8_0(self.q, self.scale)

    def product(self, x: np.ndarray) -> np.ndarray:
        y = np.empty((x.shape[0], self.shape[0]), np.float32)
        launch("int8_product", self.q, self._scale_bits, x, y)
        return y

    def __getitem__(self, ids) -> np.ndarray:
        return dequantize_q8_0(self.q[ids], self.scale[ids])


class Int4Weight(NarrowWeight):
    """W~ = d q + low per block of 32 weights of a row, q in [0, 15]: GGUF Q4_1's numbers
    (sheepop.arch.quantize.quantize_groups; d and low kept in float32, so a Q4_1 file's own
    float16 values are held exactly), q two to a byte in Q4_1's order (`packed[o, 16 g + j]`:
    q at input 32 g + j in its low half, at 32 g + 16 + j in its high half)."""

    kernel_rows = INTEGER_KERNEL_ROWS
    rounds_x = True

    def __init__(self, w: np.ndarray):
        super().__init__(np.shape(w))
        out, width = self.shape
        if width % GROUP:
            raise ValueError(f"4-bit groups of {GROUP} need a width that is a multiple of it, "
                             f"not {width}")
        q, self.scale, self.low = quantize_groups(w)
        q = q.reshape(out, width // GROUP, GROUP)
        self.packed = (q[..., :GROUP // 2] | (q[..., GROUP // 2:] << 4)).reshape(out, -1)
        self.nbytes = self.packed.nbytes + self.scale.nbytes + self.low.nbytes

    def groups(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(q uint8 (out, in), d, low (out, in / 32)) as quantize_groups gave them."""
        pairs = self.packed.reshape(len(self.packed), -1, GROUP // 2)
        q = np.concatenate([pairs & 15, pairs >> 4], axis=-1).reshape(self.shape)
        return q, self.scale, self.low

    def dequantized(self) -> np.ndarray:
        return dequantize_groups(*self.groups())

    def product(self, x: np.ndarray) -> np.ndarray:
        y = np.empty((x.shape[0], self.shape[0]), np.float32)
        launch("int4_product", self.packed, self.scale, self.low, x, y)
        return y

    def __getitem__(self, ids) -> np.ndarray:  # never a table: int4 keeps the head in int8
        return self.dequantized()[ids]


NARROW = {"bfloat16": Bf16Weight, "int8": Int8Weight, "int4": Int4Weight}


def narrows(name: str, shape: tuple[int, ...], tied: bool) -> bool:
    """Whether the parameter `name` is held narrow: a linear layer's matrix in the blocks, the
    head's, or the token table when the head reads it (tied)."""
    return (uses_muon(name, shape) or name == "head.weight"
            or (tied and name == "tok_emb.weight"))


def narrow_kind(name: str, dtype: str) -> type[NarrowWeight]:
    """The unit that holds `name` in `dtype`: int4 keeps the head (or the table it reads) in
    int8, as the torch engine and GGUF files do (SmolLM2's Q4_1 file has a Q8_0 table)."""
    if dtype == "int4" and not name.startswith("blocks."):
        return Int8Weight
    return NARROW[dtype]


def warm_kernels(weights: Mapping[str, object]) -> str | None:
    """Run each kernel the narrow matrices in `weights` use once, on a row and on a prompt's
    rows (its rounding of x, for int8 and int4): numba compiles it (~0.1-1.5 s a kernel) or
    loads it from its on-disk cache. The start-up line that says so when something was
    compiled (the first start on a machine, or after sheepop changed), else None."""
    kinds = {type(w) for w in weights.values() if isinstance(w, NarrowWeight)}
    if not kinds:
        return None

    def run() -> None:
        for kind in kinds:  # a decode step's product and a prompt's (its rounding of x)
            weight = kind(np.zeros((1, GROUP), np.float32))
            weight.product(np.zeros((1, GROUP), np.float32))
            weight.wide_product(np.zeros((weight.kernel_rows + 1, GROUP), np.float32))
    return compiling(kernels().KERNELS, run)


def compiling(compiled_kernels, run) -> str | None:
    """`run()`, which calls numba's `compiled_kernels`: the start-up line naming those it
    compiled (rather than loading them from numba's cache) and the seconds it took, or None."""
    def misses(kernel) -> int:  # numba counts them over the process, not per call
        return sum(kernel.stats.cache_misses.values())
    before = {k: misses(k) for k in compiled_kernels}
    start = time.perf_counter()
    run()
    seconds = time.perf_counter() - start
    compiled = [k for k in compiled_kernels if misses(k) > before[k]]
    if not compiled:
        return None
    names = ", ".join(dict.fromkeys(k.__name__.removesuffix("_serial") for k in compiled))
    return (f"sheepop: kernels: {names} compiled in {seconds:.1f} s (numba's cache "
            f"{compiled[0].stats.cache_path} keeps them for the next start)")


def narrow_weights(weights: MutableMapping[str, np.ndarray], dtype: str,
                   consume: bool = False) -> dict[str, np.ndarray | NarrowWeight]:
    """`weights` with every matrix `narrows` names as a NarrowWeight of `dtype`, the others as
    they are, in a new dict. `consume`: each float32 matrix leaves `weights` as soon as its
    narrow form is made, so that at no moment are both whole models held."""
    if dtype not in NARROW:
        raise ValueError(f"narrow weights are {', '.join(NARROW)}, not {dtype!r}")
    tied = "head.weight" not in weights
    if dtype == "int4":
        bad = [f"{n.removesuffix('.weight')} is {np.shape(w)[0]} x {np.shape(w)[1]}"
               for n, w in weights.items()
               if uses_muon(n, np.shape(w)) and np.shape(w)[1] % GROUP]
        if bad:
            raise UserError(f"--dtype int4: {'; '.join(bad[:3])}: 4-bit groups need inputs in "
                            f"multiples of {GROUP}")
    held: dict[str, np.ndarray | NarrowWeight] = {}
    for name in list(weights):
        w = weights.pop(name) if consume else weights[name]
        try:
            held[name] = narrow_kind(name, dtype)(w) if narrows(name, np.shape(w), tied) else w
        except ValueError as e:  # a weight that Q8_0's float16 scales cannot hold
            raise UserError(f"--dtype {dtype}: {name.removesuffix('.weight')}: {e}") from None
    return held
