"""The NumPy engine's weights in fewer bytes (sheepop.scratch.narrow, its numba kernels in
sheepop.scratch.narrow_kernels): bf16 bits rounded as torch rounds them, every product equal to
the float64 product with the same narrow values within float32's error bound for its length, on
both paths (the kernels up to kernel_rows rows, OpenBLAS past them), the lookups exact, and a
whole model's logits as close to the exact model's as the float32 engine's are."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from sheepop.arch.quantize import bf16_bits, quantize_q8_0
from sheepop.config.schema import INFERENCE_DTYPES, ModelConfig
from sheepop.inference.load import build
from sheepop.inference.weights import model_weights
from sheepop.scratch import narrow
from sheepop.scratch.gpt import gpt_forward
from sheepop.scratch.init import init_params
from sheepop.scratch.lm import NumpyLM
from sheepop.scratch.narrow import (
    Bf16Weight,
    Int4Weight,
    Int8Weight,
    NarrowWeight,
    narrow_weights,
    warm_kernels,
)

EPS32 = float(np.finfo(np.float32).eps)
KINDS = {"bfloat16": Bf16Weight, "int8": Int8Weight, "int4": Int4Weight}


def test_the_dtypes_are_the_configs():
    assert set(narrow.NARROW) == set(INFERENCE_DTYPES) - {"float32"}


def test_bf16_bits_round_to_nearest_even_as_torch_does():
    rng = np.random.default_rng(0)
    w = np.concatenate([rng.normal(size=4000).astype(np.float32),
                        np.float32([0.0, -0.0, 1.0, -1.5, 3e38, 1e-40, 65504.0]),
                        # halfway cases: bf16's last kept bit 0 (stays) and 1 (rounds up)
                        np.array([0x3F808000, 0x3F818000, 0xBF808000], np.uint32).view(
                            np.float32)])
    want = torch.from_numpy(w).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(bf16_bits(w), want)


def _bound(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """float32's error bound for sums of `width` products: gamma_n |x| |W|^T, n = width + 1
    (each product rounded once, each of the width - 1 additions once, in any order)."""
    n = x.shape[1] + 1
    return n * EPS32 / (1 - n * EPS32) * (np.abs(x).astype(np.float64)
                                          @ np.abs(w).astype(np.float64).T)


def _x_in_8_bits(x: np.ndarray, blocks: int) -> tuple[np.ndarray, np.ndarray]:
    """(xq, dx) as narrow_kernels.quantize_blocks defines them, here in NumPy's float32:
    dx = max |x| / 127 over each block of 32 inputs, xq = rint(x 127 / max |x|)."""
    xb = x[:, :32 * blocks].reshape(len(x), blocks, 32)
    largest = np.abs(xb).max(axis=2)
    inverse = np.where(largest > 0, np.float32(127) / np.where(largest > 0, largest, 1), 0)
    xq = np.rint(xb * inverse[..., None].astype(np.float32))
    return xq.reshape(len(x), -1), largest / np.float32(127)


def _kernel_product(w: NarrowWeight, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(exact, bound): the product in float64 and float32's error bound for it.

    bf16 multiplies x itself; int8 and int4 multiply x~, x rounded to 8 bits a block (dx xq;
    past the last whole block x itself): exact = x~ (A + B)^T, A + B = W~ (int8: A = d q,
    B = 0; int4: A = d q, B = low per input, which the kernels sum apart). The kernels' integer
    sums are exact, and every part meets at most width + 4 roundings (a block sum's conversion,
    the scales' product, the additions, int8's tail scale); OpenBLAS's path rounds x~ = dx xq
    and W~ once each and sums, so |y - exact| <= gamma_n |x~| (|A| + |B|)^T, n = width + 6."""
    width = x.shape[1]
    rounded = x.astype(np.float64)
    if isinstance(w, Bf16Weight):
        a, b = w.dequantized().astype(np.float64), 0
    else:
        blocks = width // 32
        xq, dx = _x_in_8_bits(x, blocks)
        rounded[:, :32 * blocks] = (xq.reshape(len(x), blocks, 32).astype(np.float64)
                                    * dx[..., None]).reshape(len(x), -1)
        if isinstance(w, Int8Weight):
            a, b = w.dequantized().astype(np.float64), 0
        else:
            q, d, low = (v.astype(np.float64) for v in w.groups())
            a, b = q * np.repeat(d, 32, axis=1), np.repeat(low, 32, axis=1)
    exact = rounded @ (a + b).T
    n = width + 6
    return exact, n * EPS32 / (1 - n * EPS32) * (np.abs(rounded) @ (np.abs(a) + np.abs(b)).T)


@pytest.mark.parametrize("dtype", KINDS)
@pytest.mark.parametrize(("out", "width"), [(7, 32), (33, 96), (64, 576), (8, 64), (5, 1536)])
@pytest.mark.parametrize("rows", ["one", "three", "the kernel's most", "one more"])
def test_a_product_is_its_formulas_within_float32s_bound(dtype, out, width, rows):
    """Widths of 32 (every dtype; 4-bit groups need them) and odd ones (bf16 and int8, whose
    last inputs are no whole block), through the kernels (up to kernel_rows rows) and OpenBLAS
    (more): the same formula (`_kernel_product`)."""
    limit = KINDS[dtype].kernel_rows
    rows = {"one": 1, "three": 3, "the kernel's most": limit, "one more": limit + 1}[rows]
    if dtype != "int4":
        width += 5
    rng = np.random.default_rng(out * width + rows)
    w = KINDS[dtype](rng.normal(size=(out, width)).astype(np.float32))
    x = rng.normal(size=(rows, width)).astype(np.float32)
    exact, bound = _kernel_product(w, x)
    y = x @ w.T
    assert y.dtype == np.float32 and y.shape == (rows, out)
    assert np.all(np.abs(y - exact) <= bound)


def test_x_in_8_bits_is_within_half_a_step_of_x():
    """|x - dx xq| <= dx / 2 (rint's error, and float32's in x 127 / max), each block's largest
    input at +-127 exactly, a block of zeros all zeros."""
    from sheepop.scratch.narrow import kernels
    rng = np.random.default_rng(9)
    x = (rng.normal(size=(3, 96)) * rng.uniform(1e-3, 1e3, size=(3, 1))).astype(np.float32)
    x[1, 32:64] = 0
    xq, dx, sums = kernels().quantize_blocks(x, 3, False)
    want_q, want_dx = _x_in_8_bits(x, 3)
    np.testing.assert_array_equal(xq, want_q)
    paired = kernels().quantize_blocks(x, 3, True)[0]  # the halves of blocks 0 and 1 paired
    np.testing.assert_array_equal(paired[:, :64], xq[:, :64].reshape(3, 2, 2, 16).transpose(
        0, 2, 1, 3).reshape(3, 64))
    np.testing.assert_array_equal(paired[:, 64:], xq[:, 64:])  # the odd count's last, in order
    np.testing.assert_array_equal(dx, want_dx)
    np.testing.assert_array_equal(  # x~'s block sums: dx times an exact integer, rounded once
        sums, dx * xq.reshape(3, 3, 32).sum(axis=2).astype(np.float32))
    steps = np.repeat(dx.astype(np.float64), 32, axis=1)
    error = np.abs(x - xq.astype(np.float64) * steps)
    assert np.all(error <= steps / 2 * (1 + 4 * EPS32))
    assert np.all(np.abs(xq).reshape(3, 3, 32).max(axis=2)[[0, 0, 0, 1, 1, 2, 2, 2],
                                                           [0, 1, 2, 0, 2, 0, 1, 2]] == 127)
    assert not xq[1, 32:64].any() and dx[1, 1] == 0


@pytest.mark.parametrize("dtype", KINDS)
def test_few_rows_go_through_the_kernel_and_many_through_blas(dtype, monkeypatch):
    rng = np.random.default_rng(1)
    w = KINDS[dtype](rng.normal(size=(16, 32)).astype(np.float32))
    took = []
    product = type(w).product
    monkeypatch.setattr(type(w), "product", lambda self, x: took.append(len(x)) or product(self, x))
    for rows in (1, w.kernel_rows, w.kernel_rows + 1):
        rng.normal(size=(rows, 32)).astype(np.float32) @ w.T
    rng.normal(size=(2, 32)) @ w.T  # float64 rows: BLAS, in float64
    assert took == [1, w.kernel_rows]
    assert w.kernel_rows == (16 if dtype == "bfloat16" else 128)


@pytest.mark.parametrize("dtype", KINDS)
def test_the_kernel_reads_strided_rows_and_refuses_a_wrong_width(dtype):
    rng = np.random.default_rng(2)
    w = KINDS[dtype](rng.normal(size=(8, 32)).astype(np.float32))
    x = rng.normal(size=(3, 64)).astype(np.float32)[:, ::2]  # not contiguous
    np.testing.assert_array_equal(x @ w.T, np.ascontiguousarray(x) @ w.T)
    with pytest.raises(ValueError, match="cannot multiply"):
        rng.normal(size=(1, 31)).astype(np.float32) @ w.T


def test_4bit_blocks_are_held_as_quantize_groups_made_them_in_q4_1s_order():
    """Byte j of a row's block g holds q at input 32g + j in its low half and at 32g + 16 + j
    in its high half (GGUF Q4_1's qs); groups() gives back q, d and low exactly; a width that
    is no multiple of 32 is refused."""
    from sheepop.arch.quantize import quantize_groups
    for out, width in [(1, 96), (11, 96), (7, 1536), (4, 32 * 97)]:
        w = np.random.default_rng(out).normal(size=(out, width)).astype(np.float32)
        held, made = Int4Weight(w), quantize_groups(w)
        q = made[0].reshape(out, -1, 2, 16)
        np.testing.assert_array_equal(held.packed.reshape(out, -1, 16),
                                      q[:, :, 0] | (q[:, :, 1] << 4))
        for kept, want in zip(held.groups(), made):
            np.testing.assert_array_equal(kept, want)
    with pytest.raises(ValueError, match="multiple of it, not 40"):
        Int4Weight(np.ones((4, 40), np.float32))


@pytest.mark.parametrize("dtype", KINDS)
def test_lookups_and_arrays_are_the_narrow_values(dtype):
    rng = np.random.default_rng(3)
    w = KINDS[dtype](rng.normal(size=(10, 32)).astype(np.float32))
    ids = np.array([[3, 0, 3], [9, 1, 2]])
    np.testing.assert_array_equal(w[ids], w.dequantized()[ids])
    np.testing.assert_array_equal(w[4], w.dequantized()[4])
    np.testing.assert_array_equal(np.asarray(w), w.dequantized())
    assert w.shape == (10, 32) and np.shape(w) == (10, 32)


def test_int8_holds_gguf_q8_0_blocks_and_bf16_its_rounding():
    """int8 is GGUF Q8_0: the bytes the gguf package writes for the same matrix (a sheepop
    q8_0 export, which llama.cpp runs), given back from their own dequantized values (a model
    imported from a Q8_0 file); a width that is not a multiple of 32 ends in a shorter block
    with its own scale."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize
    rng = np.random.default_rng(4)
    w = (rng.normal(size=(12, 96)) * rng.uniform(1e-4, 10, size=(12, 1))).astype(np.float32)
    w[0, :32] = 0  # a block of zeros: d = 0
    w[1, 5] = np.abs(w[1, :32]).max() / 127 * 0.5  # exactly half a step: roundf goes up
    stored = quantize(w, GGMLQuantizationType.Q8_0).reshape(12, 3, 34)
    weight = Int8Weight(w)
    q, d = weight.q, weight.scale
    np.testing.assert_array_equal(d.view(np.uint8).reshape(12, 3, 2), stored[..., :2])
    np.testing.assert_array_equal(q.view(np.uint8).reshape(12, 3, 32), stored[..., 2:])
    back = dequantize(stored.reshape(12, -1), GGMLQuantizationType.Q8_0).reshape(12, 96)
    np.testing.assert_array_equal(weight.dequantized(), back)
    again = Int8Weight(back)
    q2, d2 = again.q, again.scale
    np.testing.assert_array_equal(q2, q)
    np.testing.assert_array_equal(d2.view(np.uint16), d.view(np.uint16))
    assert weight.nbytes == 12 * 96 + 2 * 12 * 3

    odd = rng.normal(size=(3, 40)).astype(np.float32)
    q, d = quantize_q8_0(odd)
    assert d.shape == (3, 2) and (np.abs(q[:, 32:]).max(axis=1) == 127).all()
    np.testing.assert_array_equal(d[:, 1], (np.abs(odd[:, 32:]).max(axis=1) / 127
                                            ).astype(np.float16))
    np.testing.assert_array_equal(Int8Weight(odd)[np.array([[2, 0]])],
                                  Int8Weight(odd).dequantized()[None, [2, 0]])
    with pytest.raises(ValueError, match="largest weight is 1e"):
        quantize_q8_0(np.full((1, 32), 1e7, np.float32))

    np.testing.assert_array_equal(
        Bf16Weight(w).dequantized(), torch.from_numpy(w).to(torch.bfloat16).float().numpy())
    assert Bf16Weight(w).nbytes == 2 * 12 * 96


@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_a_weight_q8_0_cannot_hold_is_refused_by_name(dtype):
    """A weight past float16's range (or NaN: a corrupt checkpoint) has no Q8_0 scale: one
    message naming the matrix (exit 2 at the command line), not a traceback."""
    from sheepop.errors import UserError
    weights = init_params(_cfg(True), seed=0)
    weights["tok_emb.weight"][3, 7] = np.nan
    with pytest.raises(UserError, match=r"--dtype .*: tok_emb: Q8_0 keeps .* largest weight is "
                                        r"nan"):
        narrow_weights(weights, dtype)


def _cfg(tied: bool) -> ModelConfig:
    return ModelConfig(vocab_size=50, block_size=32, n_layer=2, n_head=4, n_kv_head=2,
                       n_embd=32, d_ff=64, pos_encoding="rope", norm="rmsnorm", ffn="swiglu",
                       bias=False, tie_weights=tied, dropout=0.0)


@pytest.mark.parametrize("tied", [True, False])
def test_the_matrices_and_the_heads_table_are_narrow_and_nothing_else(tied):
    weights = init_params(_cfg(tied), seed=0)
    held = narrow_weights(weights, "int8")
    kinds = {name for name, w in held.items() if isinstance(w, NarrowWeight)}
    matrices = {n for n, w in weights.items() if n.startswith("blocks.") and w.ndim == 2}
    assert kinds == matrices | ({"tok_emb.weight"} if tied else {"head.weight"})
    assert len(weights) == len(held)  # not consumed
    four = narrow_weights(weights, "int4")  # the blocks in 4 bits, the head's matrix in int8
    assert {n for n, w in four.items() if isinstance(w, Int4Weight)} == matrices
    assert isinstance(four["tok_emb.weight" if tied else "head.weight"], Int8Weight)
    narrow_weights(weights, "bfloat16", consume=True)
    assert weights == {}


@pytest.mark.parametrize("dtype", KINDS)
@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("shape", [(2, 12), (1, 12)])  # OpenBLAS's rows, the kernels'
def test_a_models_logits_are_as_close_to_the_exact_ones_as_its_rounding_allows(dtype, tied,
                                                                                 shape,
                                                                                 monkeypatch):
    """The narrow model against the float64 model of its own values. bf16 multiplies x itself:
    no further from it than the plain float32 engine on the same values is (up to 4x: another
    order of sums). int8 and int4 multiply x rounded to 8 bits a block, moving each input by up
    to 1/254 of its block's largest: each product moves by ~2^-8 of its size, and the logits
    after two layers' eight products by no more than 2^-6 of theirs (0.3-0.5% measured)."""
    monkeypatch.setattr(KINDS[dtype], "kernel_rows", 16)  # 2 x 12 rows: OpenBLAS, 1 x 12 not
    cfg = _cfg(tied)
    weights = init_params(cfg, seed=1)
    held = narrow_weights(weights, dtype)
    values = {n: np.asarray(w) for n, w in held.items()}
    ids = np.random.default_rng(5).integers(0, cfg.vocab_size, shape)
    exact = gpt_forward({n: w.astype(np.float64) for n, w in values.items()}, cfg, ids)[0]
    plain = gpt_forward(values, cfg, ids)[0]
    narrowed = gpt_forward(NumpyLM(cfg, held).params, cfg, ids)[0]
    scale = np.abs(exact).max()
    if dtype == "bfloat16":
        bound = 4 * np.abs(plain - exact).max() + 8 * EPS32 * scale
    else:
        bound = 2.0 ** -6 * scale
    assert np.abs(narrowed - exact).max() <= bound


@pytest.mark.parametrize("dtype", KINDS)
@pytest.mark.parametrize("seed", [2, 3])
def test_decode_steps_give_the_whole_prompts_logits(dtype, seed, monkeypatch):
    """One token a step through the kernels against the whole prompt through OpenBLAS: the same
    products, another order of float32 sums. Where x is rounded to 8 bits (int8, int4), a
    difference of float32's that crosses a rounding boundary moves that input by a step (1/127
    of its block's largest), which the later positions carry: most positions agree to
    float32's precision, none by more than such a step."""
    cfg = _cfg(True)
    lm = NumpyLM(cfg, narrow_weights(init_params(cfg, seed=seed), dtype))
    monkeypatch.setattr(KINDS[dtype], "kernel_rows", 16)  # (int8's and int4's 128: a long run)
    ids = np.random.default_rng(6).integers(0, cfg.vocab_size, 16 + 8).tolist()
    whole = lm.prompt_logits(ids)  # more rows than kernel_rows: OpenBLAS
    steps = np.stack([lm.prefill(ids[:1])] + [lm.decode(t) for t in ids[1:]])  # the kernels
    apart = np.abs(steps - whole).max(axis=1) / np.abs(whole).max()  # each position's
    if dtype == "bfloat16":
        assert apart.max() <= 1e-5
    else:
        assert apart.max() <= 2.0 ** -7 and np.mean(apart <= 1e-4) >= 0.5, apart


@pytest.mark.parametrize("dtype", KINDS)
def test_build_holds_narrow_weights_and_model_weights_widens_them(dtype):
    from sheepop.config.schema import Config
    cfg = Config()
    cfg.model = _cfg(True)
    weights = init_params(cfg.model, seed=3)
    model = build(cfg, dict(weights), engine="numpy", dtype=dtype)
    assert isinstance(model.lm.params["blocks.0.attn.qkv.weight"], KINDS[dtype])
    widened = model_weights(model)
    assert all(type(w) is np.ndarray and w.dtype == np.float32 for w in widened.values())
    np.testing.assert_array_equal(widened["tok_emb.weight"],
                                  model.lm.params["tok_emb.weight"].dequantized())


def test_the_float32_engine_never_imports_numba():
    code = ("import sys, numpy as np; from sheepop.scratch.lm import NumpyLM; "
            "import sheepop.scratch.narrow; print('numba' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


def test_the_first_start_says_what_compiling_cost_and_the_second_loads_the_cache(tmp_path):
    """warm_kernels: numba compiles a kernel once a machine and keeps it on disk (here in
    NUMBA_CACHE_DIR); the start that compiled says so in one line, the next one is quiet, and
    so is a second model built in the same process (numba counts its misses over the process)."""
    import os
    code = ("import numpy as np; from sheepop.scratch.narrow import narrow_weights, warm_kernels;"
            "w = {'blocks.0.mlp.fc.weight': np.ones((8, 32), np.float32)};"
            "print(warm_kernels(narrow_weights(w, 'int8')));"
            "print(warm_kernels(narrow_weights(w, 'int8')))")
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    said = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, env=env).stdout.strip().splitlines() for _ in range(2)]
    first = said[0][0]
    assert first.startswith("sheepop: kernels: int8_product, quantize_blocks compiled in "), said
    assert str(tmp_path) in first and said[0][1] == "None" and said[1] == ["None", "None"]
    assert warm_kernels({"ln_f.weight": np.ones(4, np.float32)}) is None  # nothing narrow


@pytest.mark.parametrize("dtype", KINDS)
def test_the_kernels_run_on_the_threads_given_and_give_the_same_numbers(dtype, monkeypatch):
    """--threads reaches numba: one thread runs a kernel's serial form, more set numba's count
    (the launching thread's) for its parallel one; each output row is one thread's whole sum,
    so 1 and 2 threads give the same bits."""
    import numba

    from sheepop import threads
    from sheepop.scratch.narrow import kernels
    rng = np.random.default_rng(7)
    w = KINDS[dtype](rng.normal(size=(40, 64)).astype(np.float32))
    x = rng.normal(size=(2, 64)).astype(np.float32)
    name = {"bfloat16": "bf16", "int8": "int8", "int4": "int4"}[dtype] + "_product"
    called = []
    for form in (name, name + "_serial"):
        kernel = getattr(kernels(), form)
        monkeypatch.setattr(kernels(), form,
                            lambda *a, kernel=kernel, form=form: called.append(form) or kernel(*a))
    got = {}
    for n in (1, 2):
        monkeypatch.setattr(threads, "applied", lambda n=n: n)
        got[n] = x @ w.T
    assert called == [name + "_serial", name]
    assert numba.get_num_threads() == min(2, numba.config.NUMBA_NUM_THREADS)
    np.testing.assert_array_equal(got[1], got[2])


@pytest.mark.parametrize("n", [1, 2])
def test_two_threads_may_compute_at_once_on_any_threading_layer(n):
    """numba's own threading layer (workqueue: where no OpenMP or TBB runtime is found)
    terminates a process whose two threads launch parallel kernels at once; `launch` runs one
    parallel kernel at a time, and the serial forms (one thread each) side by side, so a
    server's model thread and another caller can share a model. Each caller's x is its own:
    each gets its own product."""
    import os
    code = f"""
import threading, numpy as np, numba
from sheepop import threads
threads.apply({n})
from sheepop.scratch.narrow import Int4Weight, Int8Weight
rng = np.random.default_rng(0)
weights = [kind(rng.normal(size=(512, 256)).astype(np.float32))
           for kind in (Int8Weight, Int4Weight)]
xs = [rng.normal(size=(1, 256)).astype(np.float32) for _ in range(2)]
want = [[x @ w.T for w in weights] for x in xs]
wrong = []
def work(i):
    for _ in range(200):
        wrong.extend(1 for w, y in zip(weights, want[i]) if not np.array_equal(xs[i] @ w.T, y))
workers = [threading.Thread(target=work, args=(i,)) for i in range(2)]
for t in workers: t.start()
for t in workers: t.join()
print(numba.threading_layer() if {n} > 1 else "serial", len(wrong))
"""
    env = {**os.environ, "NUMBA_THREADING_LAYER": "workqueue"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["workqueue" if n > 1 else "serial", "0"]


@pytest.mark.parametrize("dtype", KINDS)
def test_an_infinite_input_gives_an_infinite_product_as_float32s_would(dtype):
    """The kernels' fast maths only reorders sums: an overflow upstream still reaches the logits
    as a number that is not finite, which every caller refuses (NumpyLM's docstring)."""
    w = KINDS[dtype](np.random.default_rng(8).normal(size=(24, 64)).astype(np.float32))
    x = np.ones((1, 64), np.float32)
    x[0, 5] = np.inf
    assert not np.isfinite(x @ w.T).all()
    x[0, 5] = np.nan
    assert np.isnan(x @ w.T).all()


TARGETS = {  # numba's CPU name and features (LLVM then compiles for that CPU, not the host),
    # and whether it has AVX2
    "x86-64 (the portable sums)": ("x86-64", "+64bit,+sse,+sse2,+cx8,+fxsr,+mmx", False),
    "Haswell (AVX2, no AVX-512)": ("haswell", "+64bit,+avx,+avx2,+bmi,+bmi2,+cmov,+cx16,+cx8,"
                                   "+f16c,+fma,+fxsr,+lzcnt,+mmx,+movbe,+popcnt,+sse,+sse2,"
                                   "+sse3,+sse4.1,+sse4.2,+ssse3,+xsave", True),
}


@pytest.mark.parametrize("target", TARGETS)
def test_the_8bit_kernels_compile_for_cpus_without_avx512_or_avx2(target, tmp_path):
    """The block sums are AVX2's instructions where numba compiles for AVX2, portable LLVM IR
    elsewhere (row_dot._dot_lanes), and so is Q8_0's float16 scale's conversion (F16C's, or
    integer arithmetic): each, compiled in a process of its own for a CPU that lacks AVX-512
    (and AVX2), computes the same formula within float32's bound, and every finite float16's
    value exactly (subnormals, zeros and signs too)."""
    import os
    import platform
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip(f"x86 CPU names; this machine is {platform.machine()}")
    from sheepop.scratch.row_dot import compiles_for_avx2
    cpu, features, avx2 = TARGETS[target]
    if avx2 and not compiles_for_avx2():
        pytest.skip("this CPU has no AVX2 to run Haswell's code on")
    code = """
import numpy as np, sys
from numba import njit
from sheepop.scratch.narrow import Int4Weight, Int8Weight
from sheepop.scratch.row_dot import compiles_for_avx2, float32_of_half
@njit
def halves(bits):
    out = np.empty(len(bits), np.float32)
    for i in range(len(bits)):
        out[i] = float32_of_half(bits[i])
    return out
rng = np.random.default_rng(0)
bits = np.arange(2 ** 16, dtype=np.uint32).astype(np.uint16)
bits = bits[np.isfinite(bits.view(np.float16))]
out = {"avx2": np.array(compiles_for_avx2()), "halves": halves(bits),
       "halves_want": bits.view(np.float16).astype(np.float32)}
for name, kind, width in [("int8", Int8Weight, 101), ("int4", Int4Weight, 96),
                          ("int4_wide", Int4Weight, 576)]:
    w = rng.normal(size=(9, width)).astype(np.float32)
    x = rng.normal(size=(3, width)).astype(np.float32)
    out[name + "_w"], out[name + "_x"], out[name + "_y"] = w, x, x @ kind(w).T
np.savez(sys.argv[1], **out)
"""
    env = {**os.environ, "NUMBA_CPU_NAME": cpu, "NUMBA_CPU_FEATURES": features,
           "NUMBA_CACHE_DIR": str(tmp_path)}
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "out.npz")], env=env,
                   check=True, timeout=300)
    got = np.load(tmp_path / "out.npz")
    assert bool(got["avx2"]) == avx2
    np.testing.assert_array_equal(got["halves"].view(np.uint32),
                                  got["halves_want"].view(np.uint32))
    for name, kind in [("int8", Int8Weight), ("int4", Int4Weight), ("int4_wide", Int4Weight)]:
        exact, bound = _kernel_product(kind(got[name + "_w"]), got[name + "_x"])
        assert np.all(np.abs(got[name + "_y"] - exact) <= bound), name


def test_the_kernels_file_changes_with_the_ir_they_inline():
    """numba finds a cached kernel stale by its own file's time only: narrow_kernels.py holds
    row_dot.py's digest, so that changing the IR changes it too (write the digest below there)."""
    import hashlib
    from pathlib import Path

    from sheepop.scratch import narrow_kernels, row_dot
    digest = hashlib.sha256(Path(row_dot.__file__).read_bytes()).hexdigest()[:16]
    assert narrow_kernels.ROW_DOT_DIGEST == digest
