"""Weights in fewer bytes (sheepop.arch.quantize, sheepop.model.quantized): the int8 round trip's
error bound, the int8 layer against its formula, bf16 and int8 models' logits against float32's,
the two int8 paths (kernel, dequantized) against each other, and the command line's --dtype in
generate, eval and chat (serve: tests/serve/test_serve_weight_dtypes.py), refusals included."""

from __future__ import annotations

import io
import json
import re
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from cli_refusal import fails
from float_tolerance import float32_tolerance
from variants import gqa, llama

from sheepop.arch.quantize import (
    QMAX,
    bf16_up,
    dequantize_groups,
    dequantize_rows,
    quantize_groups,
    quantize_rows,
)
from sheepop.checkpoint import format as checkpoint
from sheepop.cli import main
from sheepop.config.schema import Config, ModelConfig
from sheepop.errors import UserError
from sheepop.inference.load import build, load
from sheepop.model import GPT, quantized
from sheepop.model.bf16_products import Bf16Linear
from sheepop.model.quantized import (
    Int8Linear,
    deinterleave,
    interleave,
    quantize_int8,
    weight_bytes_read,
)
from sheepop.model.quantized_int4 import Int4Linear, quantize_int4
from sheepop.tokenizers import train_tokenizer
from sheepop.tokenizers.chat_format import with_chat_tokens

TEXT = "the cat sat on the mat. the dog sat on the log.\n" * 8


def test_bf16_up_is_the_smallest_bf16_at_or_above():
    x = np.array([0.0, 1.0, 1.0 + 2 ** -9, 3.3e-3, 7.7e10, 2 ** -130], dtype=np.float32)
    up = bf16_up(x)
    bits = up.view(np.uint32)
    assert (bits & 0xFFFF == 0).all()  # representable in bf16
    assert (up >= x).all()
    below = (bits - np.uint32(0x10000)).view(np.float32)  # the next bf16 down
    assert (below[x > 0] < x[x > 0]).all()
    assert up[0] == 0 and up[1] == 1 and up[2] == 1 + 2 ** -7


def test_int8_round_trip_is_within_half_a_scale_per_element():
    rng = np.random.default_rng(0)
    w = rng.normal(size=(64, 48)).astype(np.float32) * np.logspace(-4, 2, 64)[:, None]
    w[5] = 0.0  # a row of zeros: exact
    w[7, 3] = -1e4  # an outlier sets its row's scale
    q, s = quantize_rows(w)
    assert q.dtype == np.int8 and s.dtype == np.float32 and s.shape == (64,)
    assert np.abs(q.astype(int)).max() <= QMAX
    err = np.abs(w - dequantize_rows(q, s))
    assert (err <= s[:, None] / 2).all()
    assert err[5].max() == 0 and s[5] == 1
    # each row's largest |w| lands on +-127 or, the scale rounded up to bf16, just below it
    peak = np.abs(q.astype(int)).max(axis=1)
    assert (peak[np.arange(64) != 5] >= 126).all()
    assert (s.view(np.uint32) & 0xFFFF == 0).all()
    rel = err.max(axis=1) / np.abs(w).max(axis=1).clip(1e-30)
    assert rel.max() <= 1 / 254 * 1.01  # half a step of 127 per row, at most


# widths 16 and 576 (SmolLM2's): the kernel for up to 8 rows; 8, 24, 40 and 184 (multiples of 8,
# not of 16: garbage or a crash from torch's AVX-512 path), 36 (interleaved) and 42 (plain
# columns): the dequantized product on every CPU
@pytest.mark.parametrize("width,outputs", [(16, 32), (576, 32), (8, 32), (24, 32), (40, 32),
                                           (184, 32), (36, 32), (42, 32), (16, 24), (40, 24)])
def test_int8_linear_computes_its_formula_in_both_paths(width, outputs, monkeypatch,
                                                        record_property):
    """Every call of torch's int8 kernel meets the condition it has on every CPU torch may
    dispatch it to (aten/src/ATen/native/cpu/int8mm_kernel.cpp: its AVX-512 path reads 16
    columns a step with aligned loads and no tail), so the test fails on an AVX2 machine too
    when a width the AVX-512 path cannot take reaches it; the kernel is still called where it
    can be; and both paths compute the formula. The CPU capability the kernel ran with (AVX2,
    AVX512 or DEFAULT: ATEN_CPU_CAPABILITY) and the paths taken are recorded as properties
    (`--junitxml`) and in the assertion messages."""
    capability = torch.backends.cpu.get_cpu_capability()
    kernel, calls = torch.ops.aten._weight_int8pack_mm, []

    def checked(x, q, s):
        assert x.shape[1] % 16 == 0 and x.is_contiguous(), (capability, x.shape)
        assert q.shape[0] % 16 == 0, (capability, q.shape)  # the outputs, 16 at a time
        assert x.data_ptr() % 32 == 0 and q.data_ptr() % 16 == 0, capability
        calls.append(x.shape[0])
        return kernel(x, q, s)

    monkeypatch.setattr(torch.ops.aten, "_weight_int8pack_mm", checked)
    torch.manual_seed(0)
    base = torch.nn.Linear(width, outputs)
    layer = Int8Linear.from_weight(base.weight, base.bias)
    q, s = quantize_rows(base.weight.detach().numpy())
    assert layer.interleaved == (width % 4 == 0)
    assert np.array_equal(layer.quantized().numpy(), q)
    assert np.array_equal(layer.scale.float().numpy(), s)
    w = torch.from_numpy(dequantize_rows(q, s)).double()
    bias = base.bias.detach().double()
    for rows in (1, 8, 9, 64):  # <= 8: the int8 kernel where it can; more: dequantized
        x = torch.randn(rows, width)
        xb = x.bfloat16().double()
        want, size = xb @ w.T, xb.abs() @ w.abs().T
        got = layer(x).double() - bias
        # the float32 sum (any order), rounded to bf16 once (8 significant bits: 2^-8 of it),
        # then the bias added and taken off in float32
        bound = 2 ** -8 * want.abs() + float32_tolerance(width, 2) * (size + bias.abs())
        assert ((got - want).abs() <= bound).all(), (capability, rows)
    paths = f"{capability}: kernel for rows {calls}" if calls else f"{capability}: dequantized"
    record_property("int8_paths", paths)
    assert calls == ([1, 8] if width % 16 == 0 and outputs % 16 == 0 else []), paths


def test_interleaved_columns_put_each_quarter_in_its_own_byte_of_a_word():
    q = torch.arange(2 * 12, dtype=torch.int8).reshape(2, 12)
    stored = interleave(q)
    assert stored[0].tolist() == [0, 3, 6, 9, 1, 4, 7, 10, 2, 5, 8, 11]
    assert torch.equal(deinterleave(stored), q)
    words = stored.view(torch.int32)  # little-endian: byte k of word j is column k * 3 + j
    assert [[(int(w) >> (8 * k)) & 255 for k in range(4)] for w in words[1]] == [
        [12, 15, 18, 21], [13, 16, 19, 22], [14, 17, 20, 23]]


@pytest.mark.parametrize("words_loop", [True, False])
def test_the_compiled_int8_product_is_the_kernels_formula(words_loop, monkeypatch):
    """Under torch.compile up to 8 rows run `_words_product` (the loop inductor fuses) where
    WORDS_LOOP_PAYS (an AVX2 CPU), else torch's kernel as eagerly. Eager, the loop is
    bf16(bf16(x) q^T s) as the kernel computes it; compiled, inductor keeps x and y in float32
    where the code rounds them to bf16 (its default, emulate_precision_casts off), so the
    compiled loop's result is x q^T s within float32's error, and within the two bf16
    roundings (2^-8 of sum |x_i w_i|, 2^-8 of |y|) of the kernel's; the compiled kernel's is
    the eager kernel's. Both paths are taken here whatever this CPU is."""
    monkeypatch.setattr(quantized, "WORDS_LOOP_PAYS", words_loop)
    torch._dynamo.reset()  # (the flag is read when dynamo traces)
    torch.manual_seed(1)
    layer = Int8Linear.from_weight(torch.randn(48, 64) * 0.1, torch.randn(48))
    compiled = torch.compile(layer, dynamic=True)
    w = layer.dequantized().double()
    for rows in (1, 2):
        x = torch.randn(rows, 64)
        kernel, got = layer(x) - layer.bias, compiled(x) - layer.bias
        eager_words = layer._words_product(x.bfloat16()).float()  # the bf16 roundings kept
        # measured: the same bf16 numbers, but for (y + b) - b's float32 rounding (1.2e-7)
        assert torch.allclose(eager_words, kernel, rtol=0, atol=1e-6), rows
        if not words_loop:  # the kernel itself (its bf16 result), but for (y + b) - b
            assert torch.allclose(got, kernel, rtol=0, atol=1e-6), rows
            assert not torch.allclose(got.double(), x.double() @ w.T, rtol=0, atol=1e-5)
            continue
        exact, size = x.double() @ w.T, x.double().abs() @ w.abs().T
        assert torch.allclose(got.double(), exact, rtol=0, atol=1e-5), rows
        assert ((got - kernel).abs() <= 2 ** -8 * (size + kernel.abs())).all(), rows


def test_the_compiled_bf16_product_is_the_float32_sum_of_the_bf16_weights():
    """Bf16Linear: eagerly F.linear itself; compiled, up to 8 rows, sum_i x_i float(W_oi) in
    float32 (the loop inductor fuses), within float32's error of that sum in float64 (K = 64
    terms: 64 * 2^-24 of sum |x_i W_oi|), and so within bf16 F.linear's roundings of it."""
    torch.manual_seed(2)
    linear = torch.nn.Linear(64, 48).to(torch.bfloat16)
    layer = Bf16Linear(linear)
    compiled = torch.compile(layer, dynamic=True)
    w = layer.weight.double()
    for rows in (1, 3):
        x = torch.randn(rows, 64, dtype=torch.bfloat16)
        assert torch.equal(layer(x), F.linear(x, linear.weight, linear.bias))
        got = compiled(x).double() - layer.bias.double()
        exact, size = x.double() @ w.T, x.double().abs() @ w.abs().T
        # the compiled output is rounded to bf16 on the way out (x's dtype), then the bias
        # added in bf16: 2 bf16 steps of |y| and of |y + b| at most
        bound = 64 * 2 ** -24 * size + 2 ** -8 * (exact.abs() + (exact + layer.bias).abs())
        assert ((got - exact).abs() <= bound).all(), rows
    graphs = []

    def backend(graph, example_inputs):  # what dynamo hands inductor: the loop, not F.linear
        graphs.append(graph)
        return graph.forward
    torch._dynamo.reset()
    torch.compile(layer, backend=backend)(torch.randn(1, 64, dtype=torch.bfloat16))
    calls = {str(n.target) for g in graphs for n in g.graph.nodes if n.op == "call_function"}
    assert not any("linear" in c for c in calls) and any("mul" in c for c in calls), calls


@pytest.fixture(scope="module")
def small():
    cfg = Config()
    cfg.model = ModelConfig(vocab_size=61, block_size=64, n_layer=2, n_embd=64, dropout=0.0,
                            **llama(tie_weights=True, **gqa(4, 2)))
    torch.manual_seed(3)
    return cfg, GPT(cfg.model).numpy_weights()


def test_bf16_and_int8_logits_are_close_to_float32s(small):
    cfg, weights = small
    ids = np.random.default_rng(1).integers(0, 61, size=40).tolist()
    logits = {d: build(cfg, weights, engine="torch", device="cpu", dtype=d).lm.full(ids)
              for d in ("float32", "bfloat16", "int8")}
    scale = np.abs(logits["float32"]).max()
    gap = {d: np.abs(logits[d] - logits["float32"]).max() / scale for d in logits}
    # measured (this seed): bfloat16 0.0014, int8 0.0020 of the largest logit; 3x that allowed
    assert gap["float32"] == 0 and gap["bfloat16"] < 0.005 and gap["int8"] < 0.006, gap
    assert gap["int8"] > 0  # the weights really changed


def test_int8_decode_steps_agree_with_the_whole_prompt(small):
    """Decoding token by token runs the int8 kernel (1 row), the whole prompt the dequantized
    product (40 rows): the same numbers up to the order of the float32 sums."""
    cfg, weights = small
    lm = build(cfg, weights, engine="torch", device="cpu", dtype="int8").lm
    ids = np.random.default_rng(2).integers(0, 61, size=40).tolist()
    whole = lm.full(ids)
    lm.prefill(ids[:1])
    steps = [lm.decode(t) for t in ids[1:]]
    # measured: equal (both results are rounded to bf16, which hides the sums' order)
    assert np.abs(steps[-1] - whole).max() <= 1e-3 * np.abs(whole).max()


def test_int8_reads_about_a_quarter_of_the_bytes(small):
    cfg, weights = small
    model = GPT(cfg.model)
    model.load_numpy_weights(weights)
    before = weight_bytes_read(model)
    after = weight_bytes_read(quantize_int8(model))
    # matrices at 1 byte + a 2-byte scale per row; the norms stay float32
    assert 0.25 < after / before < 0.3, (before, after)


# ----- the command line -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny run whose tokenizer has the chat template (chat needs one)."""
    tok, _ = with_chat_tokens(train_tokenizer("char", [TEXT]))
    cfg = Config()
    cfg.model = ModelConfig(vocab_size=tok.vocab_size, block_size=32, n_layer=1, n_head=2,
                            n_embd=32, dropout=0.0)
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("dtypes")
    checkpoint.save_checkpoint(root / "run", GPT(cfg.model).numpy_weights(), cfg.to_dict(),
                               tok.to_json())
    (root / "text.txt").write_text(TEXT)
    return root / "run", root / "text.txt"


@pytest.mark.parametrize("engine", ["torch", "numpy", "auto"])
@pytest.mark.parametrize("dtype", ["bfloat16", "int8", "int4"])
def test_generate_takes_the_dtype(run, dtype, engine, capsys):
    """Each engine's tokens are its own model's greedy ones; `auto` runs every dtype on the
    NumPy engine's kernels on a CPU (sheepop.inference.engine_choice)."""
    argv = ["generate", str(run[0]), "--prompt", "the", "--temperature", "0",
            "--max-new-tokens", "6", "--threads", "1", "--dtype", dtype, "--engine", engine]
    assert main(argv) == 0
    out = capsys.readouterr()
    ran = "numpy" if engine == "auto" else engine
    assert f"{ran} engine, {dtype}" in out.err
    model = load(run[0], ran, "cpu", dtype)
    ids = model.tokenizer.encode("the")
    want = model.lm.greedy(np.array([ids]), 6)[0]
    assert out.out == "the" + model.tokenizer.decode(want.tolist()) + "\n"


def test_generate_compiled_int8_gives_the_eager_tokens(run, capsys):
    """`--compile --dtype int8`: the decode steps run Int8Linear._words_product (inductor's loop,
    activations not rounded to bf16), the eager model the int8 kernel; greedy tokens agree."""
    argv = ["generate", str(run[0]), "--prompt", "the", "--temperature", "0",
            "--max-new-tokens", "8", "--threads", "1", "--dtype", "int8", "--engine", "torch"]
    assert main(argv) == 0
    eager = capsys.readouterr().out
    assert main([*argv, "--compile"]) == 0
    compiled = capsys.readouterr()
    assert compiled.out == eager and len(eager) > len("the\n")
    # the start-up line says what compiling cost (inductor's cache may make it short)
    assert re.search(r"^sheepop: compile: the decode step ready in \d+\.\d s ", compiled.err,
                     re.M), compiled.err


def test_eval_takes_the_dtype(run, capsys):
    figures = {}
    for dtype in ("float32", "bfloat16", "int8"):
        assert main(["eval", str(run[0]), "--data", str(run[1]), "--json", "--threads", "1",
                     "--dtype", dtype]) == 0
        figures[dtype] = json.loads(capsys.readouterr().out)
    f32 = figures["float32"]["bits_per_byte"]
    for dtype in ("bfloat16", "int8"):
        assert figures[dtype]["tokens"] == figures["float32"]["tokens"]
        assert figures[dtype]["bits_per_byte"] != f32  # computed in another dtype...
        assert abs(figures[dtype]["bits_per_byte"] - f32) < 0.01  # ...to nearly the same


def test_chat_takes_the_dtype(run, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("the cat\n"))
    assert main(["chat", str(run[0]), "--temperature", "0", "--max-new-tokens", "4",
                 "--threads", "1", "--dtype", "int8"]) == 0
    out = capsys.readouterr()
    assert "engine: numpy" in out.err and len(out.out.splitlines()) == 1


def test_chat_compiles_the_decode_step_too(run, capsys, monkeypatch):
    """`sheepop chat --compile` builds its model as generate does (inference.load): the answer
    is the eager one's (greedy, int8: the same kernel on AVX-512, the words loop within the
    bf16 roundings on AVX2), and the start-up line says what compiling cost."""
    argv = ["chat", str(run[0]), "--temperature", "0", "--max-new-tokens", "6", "--threads",
            "1", "--dtype", "int8", "--engine", "torch"]
    answers = []
    for extra in ([], ["--compile"]):
        monkeypatch.setattr(sys, "stdin", io.StringIO("the cat\n"))
        assert main([*argv, *extra]) == 0
        out = capsys.readouterr()
        answers.append(out.out)
    assert answers[0] == answers[1] and answers[0].strip()
    assert re.search(r"^sheepop: compile: the decode step ready in \d+\.\d s ", out.err,
                     re.M), out.err


def test_chat_refuses_compile_on_the_numpy_engine(run, capsys):
    fails(capsys, ["chat", str(run[0]), "--engine", "numpy", "--compile"], "compile", "torch")


def test_an_unknown_dtype_is_refused(run, capsys):
    with pytest.raises(SystemExit) as e:
        main(["generate", str(run[0]), "--dtype", "float16"])
    assert e.value.code == 2 and "invalid choice: 'float16'" in capsys.readouterr().err


# ----- 4-bit groups in GGUF Q4_1's layout (--dtype int4) ----------------------------------------


def test_4bit_groups_round_trip_and_give_back_their_own_blocks():
    w = np.random.default_rng(4).normal(size=(32, 96)).astype(np.float32)
    w[3, :32] = 0.5  # a constant group: exact
    q, d, low = quantize_groups(w)
    assert q.max() <= 15 and d.shape == low.shape == (32, 3)
    back = dequantize_groups(q, d, low)
    assert (np.abs(w - back) <= np.repeat(d, 32, axis=1) / 2 + 1e-7).all()
    assert (back[3, :32] == 0.5).all()
    q2, d2, low2 = quantize_groups(back)  # a Q4_1 model's float32 weights: the same blocks
    assert np.array_equal(q2, q) and np.array_equal(low2, low)
    assert np.allclose(d2, d, rtol=1e-6, atol=0)


def test_int4_linear_computes_its_formula_in_both_paths():
    torch.manual_seed(0)
    base = torch.nn.Linear(64, 48)
    layer = Int4Linear(base.weight, base.bias)
    q, d, low = quantize_groups(base.weight.detach().numpy())
    # the kernel's (q - 8) s + z with s, z in bf16: within bf16's rounding of the exact blocks
    exact = dequantize_groups(q, d, low)
    assert np.allclose(layer.dequantized().numpy(), exact, atol=2 ** -8 * np.abs(exact).max())
    for rows in (1, 8, 9, 40):
        x = torch.randn(rows, 64)
        want = x.bfloat16().double() @ layer.dequantized().double().T
        got = layer(x).double() - base.bias.detach().double()
        assert torch.allclose(got, want, rtol=2 ** -8, atol=1e-5), rows


def test_int4_logits_are_close_and_bad_shapes_refused(small):
    cfg, weights = small
    ids = np.random.default_rng(1).integers(0, 61, size=40).tolist()
    f32 = build(cfg, weights, engine="torch", device="cpu").lm.full(ids)
    model = build(cfg, weights, engine="torch", device="cpu").lm
    quantize_int4(model.model)
    gap = np.abs(model.full(ids) - f32).max() / np.abs(f32).max()
    assert 0 < gap < 0.035, gap  # 4 bits of random weights: measured 0.011
    odd = ModelConfig(vocab_size=61, block_size=8, n_layer=1, n_head=2, n_embd=40)
    with pytest.raises(UserError, match="blocks.0.attn.qkv is 120 x 40"):
        quantize_int4(GPT(odd))


@pytest.mark.parametrize("engine", ["torch", "numpy"])
def test_int4_refuses_a_shape_its_kernel_cannot_take(tmp_path, capsys, engine):
    tok = train_tokenizer("char", [TEXT])
    cfg = Config()
    cfg.model = ModelConfig(vocab_size=tok.vocab_size, block_size=16, n_layer=1, n_head=2,
                            n_embd=40)
    checkpoint.save_checkpoint(tmp_path / "run", GPT(cfg.model).numpy_weights(), cfg.to_dict(),
                               tok.to_json())
    fails(capsys, ["generate", str(tmp_path / "run"), "--dtype", "int4", "--threads", "1",
                   "--engine", engine],
          "blocks.0.attn.qkv is 120 x 40", "multiples of 32")
