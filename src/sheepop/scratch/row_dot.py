"""One row's product of the narrow kernels (sheepop.scratch.narrow_kernels) against x rounded to
8 bits a block, written in LLVM's IR and called from numba as intrinsics (`int4_dot`,
`int8_dot`, and `float32_of_half` for Q8_0's float16 scales): `_row_dot`'s formulas.

Each block's sum stays in a vector register, its eight 32-bit partial sums converted and scaled
into a float32 vector, one horizontal sum at the row's end (numba's loops gave LLVM a horizontal
sum a block, or a round trip of each block's sums through memory). With AVX2 (and F16C) a
block is `vpmaddubsw` (unsigned by signed 8 bits, adjacent pairs summed to 16 bits, never
saturated: at most 2 x 255 x 127) and `vpmaddwd` by ones; int8's signed q moves its sign onto
xq (`vpsignb`) and multiplies as |q|, as llama.cpp does. Where numba compiles for a CPU
without AVX2, portable IR (widen, multiply, add) that any LLVM target lowers. Measured on the
AVX-512 EPYC, one thread, SmolLM2's 4-bit matrices (80 MB) streamed, alternating: float32 loops
on x itself (the version before) 5.0-7.8 ms, these 2.4-3.4 ms.

numba inlines this IR into the kernels it caches and finds a cached kernel stale by its own
file's time only: narrow_kernels.ROW_DOT_DIGEST holds this file's digest (a test checks it), so
that a change here changes that file too.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import codegen, config
from numba.extending import intrinsic

from sheepop.arch.quantize import GROUP as BLOCK  # inputs a scale of x (and of 4-bit W) covers

I8, I16, I32, I64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
F32 = ir.FloatType()
LANES = 8  # the 32-bit partial sums of a block: a 256-bit register


def _vector(kind: ir.Type, n: int) -> ir.VectorType:
    return ir.VectorType(kind, n)


def _splat(kind: ir.Type, n: int, value) -> ir.Constant:
    return ir.Constant(_vector(kind, n), [value] * n)


def compiles_for_avx2() -> bool:
    """Whether numba's code targets a CPU with AVX2 and F16C (every AVX2 CPU has both): the
    features numba hands LLVM (NUMBA_CPU_FEATURES where set, else the host's), read as numba
    reads them."""
    features = config.CPU_FEATURES
    if features is None:
        features = codegen.get_host_cpu_features()
    return {"+avx2", "+f16c"} <= set(features.split(","))


def _declared(module: ir.Module, name: str, result: ir.Type, *args: ir.Type) -> ir.Function:
    """The LLVM function `name` (an intrinsic), declared once in the module."""
    if name in module.globals:
        return module.globals[name]
    return ir.Function(module, ir.FunctionType(result, list(args)), name)


def _float_of_half(b: ir.IRBuilder, bits: ir.Value, f16c: bool) -> ir.Value:
    """The float32 value of a float16's bits (i16), exactly, for a finite float16 (Q8_0's d).
    With F16C one conversion (`vcvtph2ps`); elsewhere integer arithmetic, for LLVM would call
    a library function there:

        value = (-1)^s m' 2^(e' - 25),  m' = m + 1024 (m if e = 0),  e' = max(e, 1)

    (s, e, m the sign, 5 exponent and 10 fraction bits), m' converted exactly and 2^(e' - 25)
    a normal float32 made of its bits: no step meets a float32 subnormal, which a CPU set to
    flush them would zero."""
    if f16c:
        return b.fpext(b.bitcast(bits, ir.HalfType()), F32)
    h = b.zext(bits, I32)
    exponent = b.and_(b.lshr(h, ir.Constant(I32, 10)), ir.Constant(I32, 31))
    fraction = b.and_(h, ir.Constant(I32, 1023))
    normal = b.icmp_unsigned("!=", exponent, ir.Constant(I32, 0))
    mantissa = b.select(normal, b.or_(fraction, ir.Constant(I32, 1024)), fraction)
    power = b.bitcast(b.shl(b.add(b.select(normal, exponent, ir.Constant(I32, 1)),
                                  ir.Constant(I32, 127 - 25)), ir.Constant(I32, 23)), F32)
    value = b.fmul(b.uitofp(mantissa, F32), power)
    return b.select(b.icmp_unsigned(">=", h, ir.Constant(I32, 0x8000)), b.fneg(value), value)


def _dot_lanes(b: ir.IRBuilder, factor_pairs: list[tuple[ir.Value, ir.Value]], signed: bool,
               avx2: bool) -> ir.Value:
    """Eight 32-bit partial sums of sum_j q_j xq_j over the (q, xq) pairs of <32 x i8> in
    `factor_pairs` (one int8 block: q signed; or one or two 4-bit blocks' halves: q in 0..15), xq
    signed: lanes 0-3 sum bytes 0-15, lanes 4-7 bytes 16-31 (a 128-bit half of a register
    stays within its half, as the x86 instructions keep it)."""
    v32, words = _vector(I8, BLOCK), _vector(I16, BLOCK // 2)
    if avx2:
        pairs = None
        for q, xq in factor_pairs:
            if signed:  # sum_j |q_j| (sign(q_j) xq_j): the unsigned factor and the signed one
                xq = b.call(_declared(b.module, "llvm.x86.avx2.psign.b", v32, v32, v32), [xq, q])
                q = b.call(_declared(b.module, "llvm.abs.v32i8", v32, v32, ir.IntType(1)),
                           [q, ir.Constant(ir.IntType(1), 0)])
            madd = b.call(_declared(b.module, "llvm.x86.avx2.pmadd.ub.sw", words, v32, v32),
                          [q, xq])
            pairs = madd if pairs is None else b.add(pairs, madd)
        return b.call(_declared(b.module, "llvm.x86.avx2.pmadd.wd", _vector(I32, LANES),
                                words, words), [pairs, _splat(I16, BLOCK // 2, 1)])
    wide = _vector(I32, BLOCK)
    products = None
    for q, xq in factor_pairs:
        one = b.mul(b.sext(q, wide) if signed else b.zext(q, wide), b.sext(xq, wide))
        products = one if products is None else b.add(products, one)

    def lanes(vector: ir.Value, start: int) -> ir.Value:
        return b.shuffle_vector(vector, vector, ir.Constant(_vector(I32, LANES),
                                                            list(range(start, start + LANES))))
    first = b.add(lanes(products, 0), lanes(products, 8))     # bytes 0-15's, 8 lanes
    second = b.add(lanes(products, 16), lanes(products, 24))  # bytes 16-31's
    return b.add(*(b.shuffle_vector(first, second, ir.Constant(_vector(I32, LANES), pick))
                   for pick in ([0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15])))


PREFETCH_AHEAD = 8192
"""How far ahead of its reads of 4-bit weights a row product asks for the bytes to come into
the cache (int8: twice as far, the same number of weights). Measured on the AVX-512 EPYC, one
thread, a model's 4-bit matrices streamed from memory: no prefetch 4.2 ms, 2 KiB ahead 3.8,
4 KiB 3.4, 8 KiB 3.2, 16 KiB 3.3: the hardware's own prefetching alone left it waiting."""


def _row_dot(module: ir.Module, kind: str) -> ir.Function:
    """The LLVM function for one row's product over `blocks` blocks (none: 0):

        int4   dot(w, d, low, xq, dx, sums, blocks) = sum_g (d_g dx_g sum_j q_g,j xq_g,j
                                                             + low_g sums_g)
        int8   dot(w, d, xq, dx, blocks) = sum_g d_g dx_g sum_j q_g,j xq_g,j

    w the row's bytes (int4: 16 a block, q_j in the low half of byte j and q_16+j in its high
    half, GGUF Q4_1's order; int8: 32 a block, GGUF Q8_0's qs), d (and int4's low) its blocks'
    numbers (float32; int8's d float16 bits, as Q8_0 stores them), xq, dx and
    sums the row of x~ (narrow_kernels.quantize_blocks; int4's xq with its halves paired). Two
    blocks a step: int4 splits the pair's 32 bytes into halves at once (its odd accumulator
    stays 0); int8 sums each block into its own accumulator, as one chain of fused
    multiply-adds would wait out each one's latency (~4 cycles, more than a block's other
    work). Defined once in each module."""
    avx2 = compiles_for_avx2()
    name = f"sheepop_{kind}_row_dot_{'avx2' if avx2 else 'portable'}"
    if name in module.globals:
        return module.globals[name]
    four = kind == "int4"
    function = ir.Function(module, ir.FunctionType(F32, [ir.PointerType()] * (6 if four else 4)
                                                   + [I64]), name)
    function.linkage = "internal"
    if four:
        w, d, low, xq, dx, sums, blocks = function.args
    else:
        w, d, xq, dx, blocks = function.args
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
        d_g = (b.load(b.gep(d, [g], source_etype=F32), typ=F32) if four else
               _float_of_half(b, b.load(b.gep(d, [g], source_etype=I16), typ=I16), avx2))
        scale = b.fmul(d_g, b.load(b.gep(dx, [g], source_etype=F32), typ=F32))
        x_block = load(b, xq, g, I8, BLOCK, BLOCK)
        if four:
            packed = load(b, w, g, I8, BLOCK // 2, step)
            q = b.shuffle_vector(b.and_(packed, _splat(I8, BLOCK // 2, 15)),
                                 b.lshr(packed, _splat(I8, BLOCK // 2, 4)),
                                 ir.Constant(_vector(I32, BLOCK), list(range(BLOCK))))
            block_sums = _dot_lanes(b, [(q, x_block)], signed=False, avx2=avx2)
            block_offset = b.fmul(b.load(b.gep(low, [g], source_etype=F32), typ=F32),
                                  b.load(b.gep(sums, [g], source_etype=F32), typ=F32))
            offsets = b.insert_element(offsets, b.fadd(b.extract_element(
                offsets, ir.Constant(I32, 0)), block_offset), ir.Constant(I32, 0))
        else:
            block_sums = _dot_lanes(b, [(load(b, w, g, I8, BLOCK, step), x_block)], signed=True,
                                    avx2=avx2)
        scales = b.shuffle_vector(b.insert_element(ir.Constant(vf, None), scale,
                                                   ir.Constant(I32, 0)),
                                  ir.Constant(vf, None),
                                  ir.Constant(_vector(I32, LANES), [0] * LANES))
        return scaled(b, block_sums, scales, acc), offsets

    def pair(b: ir.IRBuilder, g: ir.Value, even: ir.Value, odd: ir.Value, offsets: ir.Value):
        """Blocks g and g + 1 (g even): (even, odd, offsets) advanced."""
        for pointer, size in ((w, step), (d, 4 if four else 2)) + (((low, 4),) if four else ()):
            b.call(prefetch, [at(b, pointer, g, size, PREFETCH_AHEAD * size // (BLOCK // 2)),
                              ir.Constant(I32, 0), ir.Constant(I32, 3), ir.Constant(I32, 1)])
        if not four:
            even, _ = block(b, g, even, offsets)
            odd, _ = block(b, b.add(g, ir.Constant(I64, 1)), odd, offsets)
            return even, odd, offsets
        packed = load(b, w, g, I8, BLOCK, step)
        pair_sums = _dot_lanes(  # q_g[:16], q_g+1[:16] and q_g[16:], q_g+1[16:] with x's halves
            b, [(b.and_(packed, _splat(I8, BLOCK, 15)), load(b, xq, g, I8, BLOCK, BLOCK)),
                (b.lshr(packed, _splat(I8, BLOCK, 4)), load(b, xq, g, I8, BLOCK, BLOCK, BLOCK))],
            signed=False, avx2=avx2)
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
    """The intrinsic that calls `_row_dot(kind)` on 1-D arrays: their data, and the last one's
    length for the blocks (dx for int8, sums for int4: G)."""
    def codegen_(context, builder, signature, args):
        arrays = [context.make_array(t)(context, builder, a)
                  for t, a in zip(signature.args, args)]
        blocks = builder.extract_value(arrays[-1].shape, 0)
        return builder.call(_row_dot(builder.module, kind), [a.data for a in arrays] + [blocks])
    return codegen_


@intrinsic
def float32_of_half(typingctx, bits):
    """The float32 value of a float16's bits (uint16), exactly (`_float_of_half`)."""
    def codegen_(context, builder, signature, args):
        return _float_of_half(builder, args[0], compiles_for_avx2())
    return types.float32(types.uint16), codegen_


@intrinsic
def int4_dot(typingctx, packed, d, low, xq, dx, sums):
    """sum_g (d[g] dx[g] sum_j q_g,j xq_g,j + low[g] sums[g]) for one row: packed (16 G,)
    uint8, d, low, dx and sums (G,) float32, xq (32 G,) int8, halves paired (`_row_dot`)."""
    return types.float32(packed, d, low, xq, dx, sums), _row_dot_call("int4")


@intrinsic
def int8_dot(typingctx, q, d, xq, dx):
    """sum_g d[g] dx[g] sum_j q[32 g + j] xq[32 g + j] for one row's G = len(dx) whole blocks:
    q (>= 32 G,) int8, d (>= G,) float16 bits (uint16), dx (G,) float32, xq (32 G,) int8
    (`_row_dot`)."""
    return types.float32(q, d, xq, dx), _row_dot_call("int8")
