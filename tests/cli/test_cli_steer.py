"""`sheepop steer make|show` and --steer on generate and chat (docs/steering.md): the vector
written is the one sheepop.inference.steer computes, strength 0 writes the plain text, a strength
changes it, and a vector of another width, a bad strength or a missing file is one line."""

from __future__ import annotations

import io
import sys

import numpy as np
import pytest
from cli_refusal import fails

from sheepop.checkpoint import format as checkpoint
from sheepop.cli import main
from sheepop.config.schema import Config, ModelConfig
from sheepop.generation.steering import read_vector
from sheepop.inference.load import load
from sheepop.inference.steer import make_vector
from sheepop.scratch.init import param_shapes
from sheepop.tokenizers import train_tokenizer
from sheepop.tokenizers.chat_format import with_chat_tokens

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: see tests/conftest.py
GREEDY = ["--temperature", "0", "--max-new-tokens", "24"]


def save_run(path, n_embd: int):
    tok, _ = with_chat_tokens(train_tokenizer("char", ["abcdefgh ijk.\n"]))
    cfg = Config()
    cfg.model = ModelConfig(vocab_size=tok.vocab_size, block_size=64, n_layer=2, n_head=2,
                            n_embd=n_embd)
    rng = np.random.default_rng(7)
    w = {k: (rng.normal(size=s) * (0.7 if len(s) > 1 else 0.2)
             + (1.0 if k.endswith("weight") and len(s) == 1 else 0.0)).astype(np.float32)
         for k, s in param_shapes(cfg.model).items()}
    checkpoint.save_checkpoint(path, w, cfg.to_dict(), tok.to_json())
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    top = tmp_path_factory.mktemp("steer")
    (top / "pos.txt").write_text("abab abab\naaa bbb\n")
    (top / "neg.jsonl").write_text('"hij hij"\n{"text": "kkk jjj"}\n')
    return top, save_run(top / "tiny", 32), save_run(top / "wide", 48)


def test_make_writes_the_mean_difference_and_show_says_what_it_is(runs, capsys):
    top, tiny, _ = runs
    out = top / "v.safetensors"
    assert main(["steer", "make", str(tiny), "--positive", str(top / "pos.txt"), "--negative",
                 str(top / "neg.jsonl"), "--layer", "1", "-o", str(out), "--engine",
                 "numpy"]) == 0
    assert f"sheepop: wrote {out}: width 32, layer 1, made on model 'tiny'" in \
        capsys.readouterr().err
    v = read_vector(out)
    expected = make_vector(load(tiny, "torch"), "tiny", ["abab abab", "aaa bbb"],
                           ["hij hij", "kkk jjj"], 1)
    np.testing.assert_allclose(v.vector, expected.vector, rtol=0,
                               atol=1e-5 * np.abs(expected.vector).max())
    assert main(["steer", "show", str(out)]) == 0
    assert "width 32, layer 1, made on model 'tiny' (2 layers), residuals read at mean " \
        "positions of 2 positive and 2 negative prompts; |v| = " in capsys.readouterr().out


@pytest.mark.parametrize("engine", ["numpy", "torch"])
def test_generate_steers_and_strength_zero_is_the_plain_text(runs, capsys, engine):
    top, tiny, _ = runs
    v = top / "v.safetensors"
    if not v.exists():
        make_vector(load(tiny, "numpy"), "tiny", ["abab abab"], ["hij hij"], 1).save(v)
    argv = ["generate", str(tiny), "--prompt", "ab", "--engine", engine, *GREEDY]

    def text(*more):
        assert main([*argv, *more]) == 0
        out, err = capsys.readouterr()
        return out, err
    plain, _ = text()
    zero, err = text("--steer", str(v), "0")
    assert zero == plain
    assert "sheepop: steering: strength 0 at layer 1 ('tiny')" in err
    steered, _ = text("--steer", str(v), "6")
    assert steered != plain
    assert text("--steer", str(v), "6", "--no-cache")[0] == steered  # the cache is steered


def test_chat_steers(runs, capsys, monkeypatch):
    top, tiny, _ = runs
    v = top / "chat.safetensors"
    make_vector(load(tiny, "numpy"), "tiny", ["abab abab"], ["hij hij"], 0).save(v)

    def chat(*argv):
        monkeypatch.setattr(sys, "stdin", io.StringIO("abc\nab\n"))
        assert main(["chat", str(tiny), "--engine", "numpy", *GREEDY, *argv]) == 0
        return capsys.readouterr().out
    plain = chat()
    assert chat("--steer", str(v), "0") == plain
    assert chat("--steer", str(v), "8") != plain


def test_mistakes_are_one_line(runs, capsys):
    top, tiny, wide = runs
    v = top / "w.safetensors"
    make_vector(load(wide, "numpy"), "wide", ["abab"], ["hij"], 1).save(v)
    fails(capsys, ["generate", str(tiny), "--prompt", "ab", "--steer", str(v), "2"],
          f"{v}: a steering vector of width 48 (made on model 'wide') cannot steer model "
          "'tiny' of width 32")
    fails(capsys, ["generate", str(wide), "--prompt", "ab", "--steer", str(v), "nan"],
          "the strength must be a finite number")
    fails(capsys, ["generate", str(wide), "--prompt", "ab", "--steer", str(top / "no"), "1"],
          "steering vector not found")
    fails(capsys, ["steer", "make", str(tiny), "--positive", str(top / "pos.txt"),
                   "--negative", str(top / "neg.jsonl"), "--layer", "2", "-o",
                   str(top / "x")], "--layer must be 0 to 1")
    fails(capsys, ["steer", "show", str(top / "pos.txt")], "pos.txt is not a valid "
          "safetensors file")
