"""`--engine auto` (sheepop.inference.load.choose_engine, sheepop.inference.engine_choice): torch
for a GPU or compile, NumPy for bfloat16, int8 and int4 on the CPU; on the CPU in float32 the
engine the measured table says decodes faster at the model's size and thread count, with the
reason printed; the same greedy tokens as the torch engine; `auto` accepted by every inference
command; and `sheepop generate` on the NumPy engine never imports torch (or the other heavy
modules) on its way to the text."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sheepop.checkpoint import format as checkpoint
from sheepop.config.schema import Config, SampleConfig
from sheepop.generation.generate import generate
from sheepop.inference import load as inference
from sheepop.inference.engine_choice import (
    DECODE_TOKENS_PER_S,
    NUMPY_MARGIN,
    Measured,
    choose,
)
from sheepop.inference.engine_choice import nearest as nearest_row
from sheepop.inference.load import build, choose_engine
from sheepop.model import GPT
from sheepop.tokenizers import train_tokenizer

TEXT = "the cat sat on the mat. "


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer("char", [TEXT], 0)


@pytest.fixture(scope="module")
def config(tokenizer) -> Config:
    cfg = Config()
    cfg.model.vocab_size = tokenizer.vocab_size
    cfg.model.n_layer, cfg.model.n_head, cfg.model.n_embd, cfg.model.block_size = 2, 2, 16, 16
    return cfg


@pytest.fixture(scope="module")
def weights(config):
    return GPT(config.model).numpy_weights()


@pytest.mark.parametrize(("device", "dtype", "compile", "gpu", "expected"), [
    ("auto", "float32", False, True, "torch"),     # a GPU driver: torch decides the device
    ("cuda", "float32", False, False, "torch"),
    ("cpu", "float32", True, False, "torch"),
    ("cpu", "int8", True, False, "torch"),
    ("cuda", "bfloat16", False, False, "torch"),
    ("cpu", "bfloat16", False, False, "numpy"),  # the NumPy engine's kernels (scratch.narrow)
    ("cpu", "int8", False, False, "numpy"),
    ("cpu", "int4", False, False, "numpy"),
])
def test_auto_is_torch_for_a_gpu_or_compile_and_numpy_for_narrow_weights_on_a_cpu(
        monkeypatch, device, dtype, compile, gpu, expected):
    monkeypatch.setattr(inference, "gpu_present", lambda: gpu)
    assert choose_engine("auto", device, dtype, compile) == expected
    assert choose_engine("torch", device, dtype, compile) == "torch"  # a named engine stays
    assert choose_engine("numpy", device, dtype, compile) == "numpy"


def _faster(row: Measured) -> str:
    return "numpy" if row.numpy >= NUMPY_MARGIN * row.torch else "torch"


def _said(row: Measured) -> str:
    ratio = row.numpy / row.torch
    if ratio >= 1:
        return f"numpy decodes {ratio:.1f}x faster"
    if ratio >= NUMPY_MARGIN:
        return f"numpy decodes at {ratio:.2f}x torch's rate"
    return f"torch decodes {1 / ratio:.1f}x faster"


@pytest.mark.parametrize("row", DECODE_TOKENS_PER_S, ids=lambda r: f"{r.shape}-{r.threads}")
def test_float32_on_the_cpu_follows_the_measured_table(row):
    """At each measured size and thread count, auto picks the engine the row says decodes
    faster (NumPy also within NUMPY_MARGIN), and the reason names the row and the ratio."""
    choice = choose(row.params, True, "float32", False, row.threads)
    assert choice.engine == ("numpy" if row.numpy >= NUMPY_MARGIN * row.torch else "torch")
    assert f"measured at {row.shape}'s" in choice.reason
    assert f"{row.threads} thread" in choice.reason
    assert _said(row) in choice.reason and choice.reason.endswith("docs/performance.md")


def test_the_nearest_row_is_by_size_on_a_log_scale_and_by_threads_from_below():
    table = (Measured("a", 1_000_000, 1, 10, 5), Measured("b", 100_000_000, 1, 5, 10),
             Measured("a", 1_000_000, 2, 1, 9), Measured("b", 100_000_000, 2, 9, 1))
    assert nearest_row(5_000_000, 1, table).shape == "a"   # log10: 0.7 from a, 1.3 from b
    assert nearest_row(20_000_000, 1, table).shape == "b"  # 1.3 from a, 0.7 from b
    assert nearest_row(20_000_000, 2, table) == table[3]
    assert nearest_row(20_000_000, 16, table) == table[3]  # above the largest: the largest
    assert nearest_row(1_000, 1, table) == table[0]


def test_numpy_wins_within_the_margin_and_says_why():
    """torch 5% faster: NumPy still (it starts ~2 s sooner); 25% faster: torch."""
    for torch_rate, engine, words in ((100.0, "numpy", "0.95x torch's rate and starts ~2 s "
                                       "sooner"), (118.75, "torch", "torch decodes 1.2x faster")):
        table = (Measured("toy", 806_272, 1, 95.0, torch_rate),)
        choice = choose(806_272, True, "float32", False, 1, table)
        assert choice.engine == engine and words in choice.reason
        assert choice.line().startswith(f"sheepop: engine: {engine} (auto: 0.8M params at "
                                        "float32 on 1 thread; measured at toy's 0.8M, 1 thread: ")


def test_build_prints_the_choice_on_stderr(config, tokenizer, weights, capsys):
    model = build(config, weights, tokenizer, "auto", "cpu")
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [inference.auto_choice("cpu", model=config.model).line()]
    assert err[0].startswith(f"sheepop: engine: {model.engine} (auto: ")


@pytest.mark.parametrize("command", ["generate", "chat", "eval", "serve"])
def test_every_inference_command_takes_auto_by_default(command):
    from sheepop.cli import build_parser
    argv = {"eval": ["eval", "RUN", "--data", "D"]}.get(command, [command, "RUN"])
    parser = build_parser()
    assert parser.parse_args(argv).engine == "auto"
    assert parser.parse_args([*argv, "--engine", "numpy"]).engine == "numpy"


def test_auto_gives_the_greedy_tokens_of_the_torch_engine(config, tokenizer, weights):
    auto = build(config, weights, tokenizer, "auto", "cpu")
    torch_model = build(config, weights, tokenizer, "torch", "cpu")
    assert (auto.engine, torch_model.engine) == ("numpy", "torch")
    greedy = SampleConfig(temperature=0.0, max_new_tokens=config.model.block_size)
    prompt = tokenizer.encode("the ")
    tokens = [[s.token for s in generate(m.lm, prompt, greedy)] for m in (auto, torch_model)]
    assert len(tokens[0]) == config.model.block_size and tokens[0] == tokens[1]


HEAVY = ("torch", "safetensors.torch", "transformers", "matplotlib", "starlette", "uvicorn")


def test_generate_on_the_numpy_engine_imports_no_torch(config, tokenizer, weights, tmp_path):
    checkpoint.save_checkpoint(tmp_path, weights, config.to_dict(), tokenizer.to_json())
    code = ("import sys\nfrom sheepop.cli import main\n"
            f"assert main(['generate', {str(tmp_path)!r}, '--prompt', 'the ', "
            "'--max-new-tokens', '3', '--device', 'cpu']) == 0\n"
            f"print([m for m in {HEAVY!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "numpy engine" in out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"
