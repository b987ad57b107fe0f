"""`--engine auto` (sheepop.inference.load.choose_engine): NumPy for float32 on the CPU, torch for a
GPU, bfloat16 or compile; the same greedy tokens as the torch engine; and `sheepop generate`
on the NumPy engine never imports torch (or the other heavy modules) on its way to the text."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sheepop.checkpoint import format as checkpoint
from sheepop.config.schema import Config, SampleConfig
from sheepop.generation.generate import generate
from sheepop.inference import load as inference
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
    ("cpu", "float32", False, True, "numpy"),
    ("auto", "float32", False, False, "numpy"),
    ("auto", "float32", False, True, "torch"),     # a GPU driver: torch decides the device
    ("cuda", "float32", False, False, "torch"),
    ("cpu", "bfloat16", False, False, "torch"),
    ("cpu", "float32", True, False, "torch"),
])
def test_auto_is_numpy_for_float32_on_the_cpu_else_torch(monkeypatch, device, dtype, compile,
                                                         gpu, expected):
    monkeypatch.setattr(inference, "gpu_present", lambda: gpu)
    assert choose_engine("auto", device, dtype, compile) == expected
    assert choose_engine("torch", device, dtype, compile) == "torch"  # a named engine stays


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
