"""The NumPy engine's products with weights in fewer bytes, compiled by numba (the one module of
sheepop that imports it; sheepop.scratch.narrow holds the weights and chooses when to call).

    bf16   y_r,o = sum_i x_r,i float(W_o,i)                 W as bfloat16 bits (uint16, out x in)
    int8   y_r,o = s_o sum_g dx_r,g sum_j q xq               q int8 (out x in), s float32 (out,)
    int4   y_r,o = sum_g (d_o,g dx_r,g sum_j q xq + low_o,g sum_j x)   q 4-bit, GGUF Q4_1

for every row r of x (float32, rows x in), g over blocks of 32 inputs, j < 32. bf16 multiplies x
itself: a bfloat16 is float32's top 16 bits, so float(W) is the bits shifted left by 16, exact,
and each sum is float32's. int8 and int4 multiply x rounded to 8 bits per block, as llama.cpp's
Q8_0 and Q8_1 activations do (`quantize_blocks`: xq = rint(x / dx), dx = max |x| / 127 over the
block), so that each block's 32 products and their sum are exact integer arithmetic (`_row_dot`,
in LLVM's IR); the scales and the sum over blocks are float32's. int4's offset term multiplies
x's exact block sums. An int8 row's last width mod 32 inputs, outside any block, multiply x in
float32.

Why compiled loops: a decode step multiplies one row by each matrix, which reads the matrix once
and is bound by that read (docs/performance.md, "Decode against the memory-bandwidth bound"),
so fewer bytes should mean a faster step. NumPy has no bfloat16 and no int8 product (`x @ q`
widens q to float first, a temporary four times q's bytes); these loops widen each weight in
registers. A row of W is read from memory once, then from the cache for every further row of x.

`cache=True` keeps each compiled kernel on disk (numba's cache: beside this file, or a user-wide
folder where that is read-only), so only the first start on a machine compiles (~1 s a kernel).
numba checks only this file's time to find a cached kernel stale, which is why the IR its
kernels inline lives here too.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import codegen, config
from numba.extending import intrinsic

from sheepop.arch.quantize import GROUP as BLOCK  # inputs a scale of x (and of 4-bit W) covers

# fastmath, only what vectorising needs: the float32 sums may be reordered into vector lanes
# (reassoc, nsz) and a product and sum fused (contract); NaN and infinity keep their meaning, so
# an overflowing model still gives logits that are not finite, which callers refuse. No bounds
# checks and NumPy's error model: the callers pass checked shapes (sheepop.scratch.narrow).
# parallel: the loop over output rows is shared among numba's threads, `numba.set_num_threads`
# of the launching thread many (sheepop.scratch.narrow sets --threads).
# Each kernel comes twice: `<name>` shares its output rows among threads, `<name>_serial` runs
# them on the calling thread, without a parallel region to start (~1 us of a product's ~2).
_FASTMATH = {"reassoc", "contract", "nsz"}
_SERIAL = dict(cache=True, fastmath=_FASTMATH, boundscheck=False, error_model="numpy",
               nogil=True)
_COMPILE = dict(_SERIAL, parallel=True)
_ROW = dict(_SERIAL, inline="always")  # one output row, written into both forms' loops


@intrinsic
def float32_of_bits(typingctx, bits):
    """The float32 whose bits are `bits` (uint32): a reinterpretation, no arithmetic (LLVM's
    bitcast; NumPy's `.view` for one number, which numba has no spelling of)."""
    def codegen_(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())
    return types.float32(types.uint32), codegen_


@njit(**_ROW)
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


@njit(**_SERIAL)
def bf16_product_serial(bits: np.ndarray, x: np.ndarray, y: np.ndarray) -> None:
    for o in range(bits.shape[0]):
        bf16_row(bits, x, y, o)


# ---- x in 8 bits a block, and the integer dot products against it ----

@njit(**_SERIAL)
def quantize_blocks(x: np.ndarray, blocks: int, halves_paired: bool
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(xq, dx, sums) for the first 32 `blocks` inputs of each row of x (rows, in) float32:
    dx[r, g] = max_j |x[r, 32g + j]| / 127, xq = rint(x / dx) int8 in -127..127 (0 where dx is
    0), sums[r, g] = sum_j x[r, 32g + j]. A block holding NaN or infinity gets dx = NaN, so every
    product it enters is NaN, as x's own would not be finite.

    xq's row holds block g at 32g.. in order, or with `halves_paired` each pair of blocks
    (g, g + 1), g even, as first halves then second halves: x_g[:16], x_g+1[:16], x_g[16:],
    x_g+1[16:] (the order 4-bit pairs read them in, `_row_dot`), an odd count's last in order."""
    rows = x.shape[0]
    xq = np.empty((rows, BLOCK * blocks), np.int8)
    dx = np.empty((rows, blocks), np.float32)
    sums = np.empty((rows, blocks), np.float32)
    half = BLOCK // 2
    for r in range(rows):
        for g in range(blocks):
            largest = np.float32(0.0)
            total = np.float32(0.0)
            finite = True
            for j in range(BLOCK):
                v = x[r, BLOCK * g + j]
                largest = max(largest, abs(v))
                total += v
                finite = finite and np.isfinite(v)
            inverse = np.float32(127.0) / largest if largest > 0 and finite else np.float32(0.0)
            paired = halves_paired and g < blocks - blocks % 2
            start = BLOCK * (g - g % 2) + half * (g % 2) if paired else BLOCK * g
            for j in range(BLOCK):
                at = start + j % half + BLOCK * (j // half) if paired else start + j
                xq[r, at] = np.int8(np.rint(x[r, BLOCK * g + j] * inverse))
            dx[r, g] = largest / np.float32(127.0) if finite else np.float32(np.nan)
            sums[r, g] = total
    return xq, dx, sums


# Each block's sum stays in a vector register: its eight lanes of 32-bit partial sums converted
# and multiplied by the block's scale into a float32 vector, one horizontal sum at the row's end.
# numba's loops gave LLVM either a horizontal sum a block or a round trip of every block's sum
# through memory, hence IR. Measured on the AVX-512 EPYC, one thread, SmolLM2's 4-bit matrices
# streamed from memory (80 MB), alternating: the float32 loops of the last version (x not
# rounded) 5.0-7.8 ms, this form 2.4-3.4 ms; in the cache, 50 GB/s.
# On x86 with AVX2 a block is `vpmaddubsw` (unsigned 8 bits by signed 8 bits, adjacent pairs
# summed to 16 bits: at most 2 x 255 x 127, so never saturated) and `vpmaddwd` by ones (pairs to
# 32 bits); for int8's signed q, `vpsignb` moves q's sign onto xq and |q| is the unsigned factor,
# as llama.cpp does. Where numba compiles for a CPU without AVX2 (another architecture, or
# NUMBA_CPU_FEATURES without it) the same sums are written in portable IR (widen, multiply,
# add), which every LLVM target lowers.

I8, I16, I32, I64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
F32 = ir.FloatType()
LANES = 8  # the 32-bit partial sums of a block: a 256-bit register


def _vector(kind: ir.Type, n: int) -> ir.VectorType:
    return ir.VectorType(kind, n)


def _splat(kind: ir.Type, n: int, value) -> ir.Constant:
    return ir.Constant(_vector(kind, n), [value] * n)


def compiles_for_avx2() -> bool:
    """Whether numba's code targets a CPU with AVX2: the features numba hands LLVM
    (NUMBA_CPU_FEATURES where set, else the host's), read as numba reads them."""
    features = config.CPU_FEATURES
    if features is None:
        features = codegen.get_host_cpu_features()
    return "+avx2" in features.split(",")


def _declared(module: ir.Module, name: str, result: ir.Type, *args: ir.Type) -> ir.Function:
    """The LLVM function `name` (an intrinsic), declared once in the module."""
    if name in module.globals:
        return module.globals[name]
    return ir.Function(module, ir.FunctionType(result, list(args)), name)


def _block_sums(b: ir.IRBuilder, q: ir.Value, xq: ir.Value, signed: bool,
                avx2: bool) -> ir.Value:
    """Eight 32-bit partial sums whose total is sum_j q_j xq_j, for two <32 x i8>: q unsigned
    (int4's) or signed (int8's), xq signed."""
    v32 = _vector(I8, BLOCK)
    if avx2:
        if signed:  # sum_j |q_j| (sign(q_j) xq_j): the unsigned factor and the signed one
            xq = b.call(_declared(b.module, "llvm.x86.avx2.psign.b", v32, v32, v32), [xq, q])
            q = b.call(_declared(b.module, "llvm.abs.v32i8", v32, v32, ir.IntType(1)),
                       [q, ir.Constant(ir.IntType(1), 0)])
        words = _vector(I16, BLOCK // 2)
        pairs = b.call(_declared(b.module, "llvm.x86.avx2.pmadd.ub.sw", words, v32, v32),
                       [q, xq])
        return b.call(_declared(b.module, "llvm.x86.avx2.pmadd.wd", _vector(I32, LANES),
                                words, words), [pairs, _splat(I16, BLOCK // 2, 1)])
    wide = _vector(I32, BLOCK)
    products = b.mul(b.sext(q, wide) if signed else b.zext(q, wide), b.sext(xq, wide))
    quarters = [b.shuffle_vector(products, products,
                                 ir.Constant(_vector(I32, LANES), list(range(k, k + LANES))))
                for k in range(0, BLOCK, LANES)]
    return b.add(b.add(quarters[0], quarters[1]), b.add(quarters[2], quarters[3]))


def _pair_sums(b: ir.IRBuilder, low: ir.Value, high: ir.Value, x_low: ir.Value,
               x_high: ir.Value, avx2: bool) -> ir.Value:
    """Two 4-bit blocks' partial sums, four a block: lanes 0-3 total block g's sum_j q_j xq_j,
    lanes 4-7 block g + 1's. low and high <32 x i8> are the pair's 32 bytes' low and high
    halves (q_g[:16], q_g+1[:16] and q_g[16:], q_g+1[16:]); x_low and x_high xq in the same
    order (`quantize_blocks`' halves_paired)."""
    v32 = _vector(I8, BLOCK)
    if avx2:  # each 128-bit half of a register stays within its block
        words = _vector(I16, BLOCK // 2)
        madd = _declared(b.module, "llvm.x86.avx2.pmadd.ub.sw", words, v32, v32)
        pairs = b.add(b.call(madd, [low, x_low]), b.call(madd, [high, x_high]))
        return b.call(_declared(b.module, "llvm.x86.avx2.pmadd.wd", _vector(I32, LANES),
                                words, words), [pairs, _splat(I16, BLOCK // 2, 1)])
    wide = _vector(I32, BLOCK)
    products = b.add(b.mul(b.zext(low, wide), b.sext(x_low, wide)),
                     b.mul(b.zext(high, wide), b.sext(x_high, wide)))

    def lanes(vector: ir.Value, start: int) -> ir.Value:
        return b.shuffle_vector(vector, vector, ir.Constant(_vector(I32, LANES),
                                                            list(range(start, start + LANES))))
    first = b.add(lanes(products, 0), lanes(products, 8))     # block g's, 8 lanes
    second = b.add(lanes(products, 16), lanes(products, 24))  # block g + 1's
    pick = [ir.Constant(_vector(I32, LANES), [0, 1, 2, 3, 8, 9, 10, 11]),
            ir.Constant(_vector(I32, LANES), [4, 5, 6, 7, 12, 13, 14, 15])]
    return b.add(b.shuffle_vector(first, second, pick[0]),
                 b.shuffle_vector(first, second, pick[1]))


PREFETCH_AHEAD = 8192
"""How far ahead of its reads of 4-bit weights a row product asks for the bytes to come into
the cache (int8: twice as far, the same number of weights). Measured on the AVX-512 EPYC, one
thread, a model's 4-bit matrices streamed from memory: no prefetch 4.2 ms, 2 KiB ahead 3.8,
4 KiB 3.4, 8 KiB 3.2, 16 KiB 3.3: the hardware's own prefetching alone left it waiting."""


def _row_dot(module: ir.Module, kind: str) -> ir.Function:
    """The LLVM function for one row's product over `blocks` blocks (none: 0):

        int4   dot(w, d, low, xq, dx, sums, blocks) = sum_g (d_g dx_g sum_j q_g,j xq_g,j
                                                             + low_g sums_g)
        int8   dot(w, xq, dx, blocks) = sum_g dx_g sum_j q_g,j xq_g,j

    w the row's bytes (int4: 16 a block, q_j in the low half of byte j and q_16+j in its high
    half, GGUF Q4_1's order; int8: 32 a block), d and low its 4-bit blocks' numbers, xq, dx and
    sums the row of x (`quantize_blocks`; int4's xq with its halves paired). Two blocks a step:
    int4 splits the pair's 32 bytes into halves at once (`_pair_sums`); int8 sums each block
    into its own accumulator, as one chain of fused multiply-adds would wait out each one's
    latency (~4 cycles, more than a block's other work). Defined once in each module."""
    avx2 = compiles_for_avx2()
    name = f"sheepop_{kind}_row_dot_{'avx2' if avx2 else 'portable'}"
    if name in module.globals:
        return module.globals[name]
    four = kind == "int4"
    function = ir.Function(module, ir.FunctionType(F32, [ir.PointerType()] * (6 if four else 3)
                                                   + [I64]), name)
    function.linkage = "internal"
    if four:
        w, d, low, xq, dx, sums, blocks = function.args
    else:
        w, xq, dx, blocks = function.args
    vf, v2 = _vector(F32, LANES), _vector(F32, 2)
    fma8 = _declared(module, "llvm.fma.v8f32", vf, vf, vf, vf)
    fma2 = _declared(module, "llvm.fma.v2f32", v2, v2, v2, v2)
    prefetch = _declared(module, "llvm.prefetch.p0", ir.VoidType(), ir.PointerType(), I32, I32,
                         I32)
    step = BLOCK // 2 if four else BLOCK  # a block's bytes of w

    def at(b: ir.IRBuilder, pointer: ir.Value, g: ir.Value, size: int, extra: int = 0):
        """The address of the g-th `size` bytes (plus `extra`)."""
        offset = b.mul(g, ir.Constant(I64, size))
        if extra:
            offset = b.add(offset, ir.Constant(I64, extra))
        return b.gep(pointer, [offset], source_etype=I8)

    def load(b: ir.IRBuilder, pointer: ir.Value, g: ir.Value, kind_: ir.Type, n: int,
             size: int, extra: int = 0) -> ir.Value:
        return b.load(at(b, pointer, g, size, extra), typ=_vector(kind_, n), align=1)

    def scaled(b: ir.IRBuilder, sums_: ir.Value, scales: ir.Value, acc: ir.Value) -> ir.Value:
        return b.call(fma8, [b.sitofp(sums_, vf), scales, acc])

    def block(b: ir.IRBuilder, g: ir.Value, acc: ir.Value, offsets: ir.Value):
        """(acc + c_g times block g's eight partial sums, offsets + its low_g sums_g)."""
        scale = b.load(b.gep(dx, [g], source_etype=F32), typ=F32)
        x_block = load(b, xq, g, I8, BLOCK, BLOCK)
        if four:
            packed = load(b, w, g, I8, BLOCK // 2, step)
            q = b.shuffle_vector(b.and_(packed, _splat(I8, BLOCK // 2, 15)),
                                 b.lshr(packed, _splat(I8, BLOCK // 2, 4)),
                                 ir.Constant(_vector(I32, BLOCK), list(range(BLOCK))))
            scale = b.fmul(b.load(b.gep(d, [g], source_etype=F32), typ=F32), scale)
            block_sums = _block_sums(b, q, x_block, signed=False, avx2=avx2)
            block_offset = b.fmul(b.load(b.gep(low, [g], source_etype=F32), typ=F32),
                          b.load(b.gep(sums, [g], source_etype=F32), typ=F32))
            offsets = b.insert_element(offsets, b.fadd(b.extract_element(
                offsets, ir.Constant(I32, 0)), block_offset), ir.Constant(I32, 0))
        else:
            block_sums = _block_sums(b, load(b, w, g, I8, BLOCK, step), x_block, signed=True,
                                     avx2=avx2)
        scales = b.shuffle_vector(b.insert_element(ir.Constant(vf, None), scale,
                                                   ir.Constant(I32, 0)),
                                  ir.Constant(vf, None),
                                  ir.Constant(_vector(I32, LANES), [0] * LANES))
        return scaled(b, block_sums, scales, acc), offsets

    def pair(b: ir.IRBuilder, g: ir.Value, even: ir.Value, odd: ir.Value, offsets: ir.Value):
        """Blocks g and g + 1 (g even): (even, odd, offsets) advanced."""
        for pointer, size in ((w, step),) + (((d, 4), (low, 4)) if four else ()):
            b.call(prefetch, [at(b, pointer, g, size, PREFETCH_AHEAD * size // (BLOCK // 2)),
                              ir.Constant(I32, 0), ir.Constant(I32, 3), ir.Constant(I32, 1)])
        if not four:
            even, _ = block(b, g, even, offsets)
            odd, _ = block(b, b.add(g, ir.Constant(I64, 1)), odd, offsets)
            return even, odd, offsets
        packed = load(b, w, g, I8, BLOCK, step)
        pair_sums = _pair_sums(b, b.and_(packed, _splat(I8, BLOCK, 15)),
                               b.lshr(packed, _splat(I8, BLOCK, 4)),
                               load(b, xq, g, I8, BLOCK, BLOCK),
                               load(b, xq, g, I8, BLOCK, BLOCK, BLOCK), avx2)
        d2, dx2, low2, sums2 = (load(b, v, g, F32, 2, 4) for v in (d, dx, low, sums))
        scale = b.fmul(d2, dx2)
        scales = b.shuffle_vector(scale, scale,
                                  ir.Constant(_vector(I32, LANES), [0, 0, 0, 0, 1, 1, 1, 1]))
        return (scaled(b, pair_sums, scales, even), odd,
                b.call(fma2, [low2, sums2, offsets]))

    entry, pairs, one, last, done = (function.append_basic_block(n)
                                     for n in ("entry", "pairs", "one", "last", "done"))
    zeros = (ir.Constant(I64, 0), ir.Constant(vf, None), ir.Constant(vf, None),
             ir.Constant(v2, None))  # g, even, odd, offsets
    b = ir.IRBuilder(entry)
    two = ir.Constant(I64, 2)
    b.cbranch(b.icmp_unsigned(">=", blocks, two), pairs, one)

    b = ir.IRBuilder(pairs)
    now = [b.phi(v.type) for v in zeros]
    after = [b.add(now[0], two), *pair(b, *now)]
    for phi, first, later in zip(now, zeros, after):
        phi.add_incoming(first, entry)
        phi.add_incoming(later, pairs)
    b.cbranch(b.icmp_unsigned("<=", b.add(after[0], two), blocks), pairs, one)

    b = ir.IRBuilder(one)
    left = [b.phi(v.type) for v in zeros]
    for phi, first, later in zip(left, zeros, after):
        phi.add_incoming(first, entry)
        phi.add_incoming(later, pairs)
    b.cbranch(b.icmp_unsigned("<", left[0], blocks), last, done)

    b = ir.IRBuilder(last)  # an odd count's last block
    even_last, offsets_last = block(b, left[0], left[1], left[3])
    b.branch(done)

    b = ir.IRBuilder(done)
    even, offsets = b.phi(vf), b.phi(v2)
    for phi, from_one, from_last in ((even, left[1], even_last), (offsets, left[3], offsets_last)):
        phi.add_incoming(from_one, one)
        phi.add_incoming(from_last, last)
    total = b.call(_declared(module, "llvm.vector.reduce.fadd.v8f32", F32, F32, vf),
                   [ir.Constant(F32, -0.0), b.fadd(even, left[2])], fastmath=("reassoc", "nsz"))
    if four:
        total = b.fadd(total, b.call(_declared(module, "llvm.vector.reduce.fadd.v2f32", F32,
                                               F32, v2), [ir.Constant(F32, -0.0), offsets],
                                     fastmath=("reassoc", "nsz")))
    b.ret(total)
    return function


def _row_dot_call(kind: str):
    """The intrinsic that calls `_row_dot(kind)` on 1-D arrays (their data and dx's length)."""
    def codegen_(context, builder, signature, args):
        arrays = [context.make_array(t)(context, builder, a)
                  for t, a in zip(signature.args, args)]
        blocks = builder.extract_value(arrays[-1].shape, 0)
        return builder.call(_row_dot(builder.module, kind), [a.data for a in arrays] + [blocks])
    return codegen_


@intrinsic
def int4_dot(typingctx, packed, d, low, xq, dx, sums):
    """sum_g (d[g] dx[g] sum_j q_g,j xq_g,j + low[g] sums[g]) for one row: packed (16 G,)
    uint8, d, low, dx and sums (G,) float32, xq (32 G,) int8, halves paired (`_row_dot`)."""
    return types.float32(packed, d, low, xq, dx, sums), _row_dot_call("int4")


@intrinsic
def int8_dot(typingctx, q, xq, dx):
    """sum_g dx[g] sum_j q[32 g + j] xq[32 g + j] for one row's G = len(dx) whole blocks:
    q (>= 32 G,) int8, xq (32 G,) int8, dx (G,) float32 (`_row_dot`)."""
    return types.float32(q, xq, dx), _row_dot_call("int8")


@njit(**_ROW)
def int8_row(q: np.ndarray, scale: np.ndarray, x: np.ndarray, xq: np.ndarray, dx: np.ndarray,
             y: np.ndarray, o: int) -> None:
    """y[r, o] = scale[o] (sum_g dx[r, g] sum_j q[o, 32g + j] xq[r, 32g + j] + sum_i x[r, i]
    q[o, i] over the inputs past the last whole block) for every row r: q (out, in) int8,
    scale (out,) float32, x (rows, in) float32 and xq, dx its 8 bits (`quantize_blocks`), y
    (rows, out) float32, written in place."""
    for r in range(x.shape[0]):
        tail = np.float32(0.0)
        for i in range(BLOCK * dx.shape[1], q.shape[1]):
            tail += x[r, i] * np.float32(q[o, i])
        y[r, o] = (int8_dot(q[o], xq[r], dx[r]) + tail) * scale[o]


@njit(**_COMPILE)
def int8_product(q: np.ndarray, scale: np.ndarray, x: np.ndarray, y: np.ndarray) -> None:
    """y = x W~^T, W~ = s q, x rounded to 8 bits a block (`int8_row`)."""
    xq, dx, _ = quantize_blocks(x, q.shape[1] // BLOCK, False)
    for o in prange(q.shape[0]):
        int8_row(q, scale, x, xq, dx, y, o)


@njit(**_SERIAL)
def int8_product_serial(q: np.ndarray, scale: np.ndarray, x: np.ndarray,
                        y: np.ndarray) -> None:
    xq, dx, _ = quantize_blocks(x, q.shape[1] // BLOCK, False)
    for o in range(q.shape[0]):
        int8_row(q, scale, x, xq, dx, y, o)


@njit(**_ROW)
def int4_row(packed: np.ndarray, scale: np.ndarray, low: np.ndarray, xq: np.ndarray,
             dx: np.ndarray, sums: np.ndarray, y: np.ndarray, o: int) -> None:
    """y[r, o] = sum_g (d[o, g] dx[r, g] sum_j q[o, 32g + j] xq[r, 32g + j] + low[o, g]
    sums[r, g]) for every row r: W~ = d q + low per block of 32 weights of a row (GGUF Q4_1),
    q in 0..15; packed (out, 16 G) uint8 (`_row_dot`'s order), scale = d and low (out, G)
    float32, xq, dx and sums x's 8 bits and block sums (`quantize_blocks`, halves paired), y
    (rows, out) float32, written in place."""
    for r in range(xq.shape[0]):
        y[r, o] = int4_dot(packed[o], scale[o], low[o], xq[r], dx[r], sums[r])


@njit(**_COMPILE)
def int4_product(packed: np.ndarray, scale: np.ndarray, low: np.ndarray, x: np.ndarray,
                 y: np.ndarray) -> None:
    """y = x~ (W~ - L)^T + x L^T for x (rows, 32 G) float32 (`int4_row`)."""
    xq, dx, sums = quantize_blocks(x, scale.shape[1], True)
    for o in prange(packed.shape[0]):
        int4_row(packed, scale, low, xq, dx, sums, y, o)


@njit(**_SERIAL)
def int4_product_serial(packed: np.ndarray, scale: np.ndarray, low: np.ndarray,
                        x: np.ndarray, y: np.ndarray) -> None:
    xq, dx, sums = quantize_blocks(x, scale.shape[1], True)
    for o in range(packed.shape[0]):
        int4_row(packed, scale, low, xq, dx, sums, y, o)


KERNELS = (bf16_product, bf16_product_serial, int8_product, int8_product_serial,
           int4_product, int4_product_serial, quantize_blocks)
"""Every function of this module numba compiles when called from Python (the rows inline)."""
