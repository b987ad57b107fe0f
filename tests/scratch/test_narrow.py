"""The NumPy engine's weights in fewer bytes (sheepop.scratch.narrow, its numba kernels in
sheepop.scratch.narrow_kernels): bf16 bits rounded as torch rounds them, every product equal to
the float64 product with the same narrow values within float32's error bound for its length, on
both paths (the kernels up to KERNEL_ROWS rows, OpenBLAS past them), the lookups exact, and a
whole model's logits as close to the exact model's as the float32 engine's are."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from sheepop.arch.quantize import bf16_bits, quantize_rows
from sheepop.config.schema import INFERENCE_DTYPES, ModelConfig
from sheepop.inference.load import build
from sheepop.inference.weights import model_weights
from sheepop.scratch import narrow
from sheepop.scratch.gpt import gpt_forward
from sheepop.scratch.init import init_params
from sheepop.scratch.lm import NumpyLM
from sheepop.scratch.narrow import (
    KERNEL_ROWS,
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


@pytest.mark.parametrize("dtype", KINDS)
@pytest.mark.parametrize(("out", "width"), [(7, 32), (33, 96), (64, 576), (8, 64), (5, 1536)])
@pytest.mark.parametrize("rows", [1, 3, KERNEL_ROWS, KERNEL_ROWS + 1, 40])
def test_a_product_is_the_narrow_values_product_within_float32s_bound(dtype, out, width, rows):
    """Widths of 32 (every dtype; 4-bit groups need them) and odd ones (bf16 and int8)."""
    if dtype != "int4":
        width += 5
    rng = np.random.default_rng(out * width + rows)
    w = KINDS[dtype](rng.normal(size=(out, width)).astype(np.float32))
    x = rng.normal(size=(rows, width)).astype(np.float32)
    exact = x.astype(np.float64) @ w.dequantized().astype(np.float64).T
    y = x @ w.T
    assert y.dtype == np.float32 and y.shape == (rows, out)
    assert np.all(np.abs(y - exact) <= _bound(x, w.dequantized()))


@pytest.mark.parametrize("dtype", KINDS)
def test_few_rows_go_through_the_kernel_and_many_through_blas(dtype, monkeypatch):
    rng = np.random.default_rng(1)
    w = KINDS[dtype](rng.normal(size=(16, 32)).astype(np.float32))
    took = []
    product = type(w).product
    monkeypatch.setattr(type(w), "product", lambda self, x: took.append(len(x)) or product(self, x))
    for rows in (1, KERNEL_ROWS, KERNEL_ROWS + 1):
        rng.normal(size=(rows, 32)).astype(np.float32) @ w.T
    rng.normal(size=(2, 32)) @ w.T  # float64 rows: BLAS, in float64
    assert took == [1, KERNEL_ROWS]


@pytest.mark.parametrize("dtype", KINDS)
def test_the_kernel_reads_strided_rows_and_refuses_a_wrong_width(dtype):
    rng = np.random.default_rng(2)
    w = KINDS[dtype](rng.normal(size=(8, 32)).astype(np.float32))
    x = rng.normal(size=(3, 64)).astype(np.float32)[:, ::2]  # not contiguous
    np.testing.assert_allclose(x @ w.T, x @ w.dequantized().T, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="cannot multiply"):
        rng.normal(size=(1, 31)).astype(np.float32) @ w.T


def test_4bit_groups_are_held_as_quantize_groups_made_them_whatever_the_rows():
    """The tiled layout gives back q, d and low exactly, a last tile padded or not; a width
    that is no multiple of 32 is refused."""
    from sheepop.arch.quantize import quantize_groups
    for out, width in [(1, 96), (8, 96), (11, 96), (7, 1536), (4, 32 * 97)]:
        assert (8 * width // 32 <= narrow.TILE_LANES) == (narrow.tile_rows(width) == 8)
        w = np.random.default_rng(out).normal(size=(out, width)).astype(np.float32)
        for held, made in zip(Int4Weight(w).groups(), quantize_groups(w)):
            np.testing.assert_array_equal(held, made)
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


def test_int8_holds_the_torch_engines_numbers_and_bf16_its_rounding():
    w = np.random.default_rng(4).normal(size=(12, 20)).astype(np.float32)
    q, s = quantize_rows(w)
    np.testing.assert_array_equal(Int8Weight(w).dequantized(), s[:, None] * q)
    np.testing.assert_array_equal(
        Bf16Weight(w).dequantized(), torch.from_numpy(w).to(torch.bfloat16).float().numpy())
    assert Int8Weight(w).nbytes == 12 * 20 + 2 * 12 and Bf16Weight(w).nbytes == 2 * 12 * 20


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
def test_a_models_logits_are_as_close_to_the_exact_ones_as_float32s(dtype, tied):
    """The narrow model against the float64 model of its own values: no further from it than
    the plain float32 engine on the same values is (up to 4x: another order of sums)."""
    cfg = _cfg(tied)
    weights = init_params(cfg, seed=1)
    held = narrow_weights(weights, dtype)
    values = {n: np.asarray(w) for n, w in held.items()}
    ids = np.random.default_rng(5).integers(0, cfg.vocab_size, (2, 12))
    exact = gpt_forward({n: w.astype(np.float64) for n, w in values.items()}, cfg, ids)[0]
    plain = gpt_forward(values, cfg, ids)[0]
    narrowed = gpt_forward(NumpyLM(cfg, held).params, cfg, ids)[0]
    scale = np.abs(exact).max()
    assert np.abs(narrowed - exact).max() <= 4 * np.abs(plain - exact).max() + 8 * EPS32 * scale


@pytest.mark.parametrize("dtype", KINDS)
def test_decode_steps_give_the_whole_prompts_logits(dtype):
    """One token a step through the kernels against the whole prompt through OpenBLAS."""
    cfg = _cfg(True)
    lm = NumpyLM(cfg, narrow_weights(init_params(cfg, seed=2), dtype))
    ids = np.random.default_rng(6).integers(0, cfg.vocab_size, KERNEL_ROWS + 8).tolist()
    whole = lm.prompt_logits(ids)  # more rows than KERNEL_ROWS: OpenBLAS
    steps = np.stack([lm.prefill(ids[:1])] + [lm.decode(t) for t in ids[1:]])  # the kernels
    np.testing.assert_allclose(steps, whole, rtol=1e-4, atol=1e-5 * np.abs(whole).max())


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
    NUMBA_CACHE_DIR); the start that compiled says so in one line, the next one is quiet."""
    import os
    code = ("import numpy as np; from sheepop.scratch.narrow import narrow_weights, warm_kernels;"
            "w = {'blocks.0.mlp.fc.weight': np.ones((8, 32), np.float32)};"
            "print(warm_kernels(narrow_weights(w, 'int8')))")
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    said = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, env=env).stdout.strip() for _ in range(2)]
    assert said[0].startswith("sheepop: kernels: int8_product compiled in "), said
    assert str(tmp_path) in said[0] and said[1] == "None"
    assert warm_kernels({"ln_f.weight": np.ones(4, np.float32)}) is None  # nothing narrow


@pytest.mark.parametrize("dtype", KINDS)
def test_the_kernels_run_on_the_threads_given_and_give_the_same_numbers(dtype, monkeypatch):
    """--threads reaches numba (its count is the launching thread's); each output row is
    one thread's whole sum, so 1 and 2 threads give the same bits."""
    import numba

    from sheepop import threads
    rng = np.random.default_rng(7)
    w = KINDS[dtype](rng.normal(size=(40, 64)).astype(np.float32))
    x = rng.normal(size=(2, 64)).astype(np.float32)
    got = {}
    for n in (1, 2):
        monkeypatch.setattr(threads, "applied", lambda n=n: n)
        got[n] = x @ w.T
        assert numba.get_num_threads() == min(n, numba.config.NUMBA_NUM_THREADS)
    np.testing.assert_array_equal(got[1], got[2])


def test_two_threads_may_compute_at_once_on_any_threading_layer():
    """numba's own threading layer (workqueue: where no OpenMP or TBB runtime is found)
    terminates a process whose two threads launch parallel kernels at once; `launch` runs one
    kernel at a time, so a server's model thread and another caller can share a model."""
    import os
    code = """
import threading, numpy as np, numba
from sheepop import threads
threads.apply(2)
from sheepop.scratch.narrow import Int8Weight
w = Int8Weight(np.random.default_rng(0).normal(size=(512, 256)).astype(np.float32))
x = np.ones((1, 256), np.float32)
want, wrong = x @ w.T, []
def work():
    wrong.extend(1 for _ in range(300) if not np.array_equal(x @ w.T, want))
workers = [threading.Thread(target=work) for _ in range(2)]
for t in workers: t.start()
for t in workers: t.join()
print(numba.threading_layer(), len(wrong))
"""
    env = {**os.environ, "NUMBA_THREADING_LAYER": "workqueue"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["workqueue", "0"]


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
