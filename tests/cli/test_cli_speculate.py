"""--speculate on the command line (sheepop generate, sheepop chat): the proposals are checked
(CachedLM.verify runs), the greedy text is the plain one, generate says what speculation did,
and a value out of range is one line."""

from __future__ import annotations

import io
import sys

import numpy as np
import pytest
from cli_refusal import fails

from sheepop.checkpoint import format as checkpoint
from sheepop.cli import main
from sheepop.config.schema import Config, ModelConfig
from sheepop.generation.cached_lm import CachedLM
from sheepop.scratch.init import param_shapes
from sheepop.tokenizers import train_tokenizer
from sheepop.tokenizers.chat_format import with_chat_tokens

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: see tests/conftest.py
GREEDY = ["--temperature", "0", "--max-new-tokens", "40"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny model whose tokenizer has the chat tokens, random weights O(1) (greedy decoding
    falls into loops the lookup finds)."""
    tok, _ = with_chat_tokens(train_tokenizer("char", ["abcdefgh ijk.\n"]))
    cfg = Config()
    cfg.model = ModelConfig(vocab_size=tok.vocab_size, block_size=128, n_layer=1, n_head=2,
                            n_embd=32, tie_weights=False)
    rng = np.random.default_rng(5)
    w = {k: (rng.normal(size=s) * (1.0 if len(s) > 1 else 0.2)
             + (1.0 if k.endswith("weight") and len(s) == 1 else 0.0)).astype(np.float32)
         for k, s in param_shapes(cfg.model).items()}
    path = tmp_path_factory.mktemp("speculate") / "run"
    checkpoint.save_checkpoint(path, w, cfg.to_dict(), tok.to_json())
    return path


@pytest.fixture
def passes(monkeypatch):
    """The forward passes after the prompt's: a checking pass (CachedLM.verify) as its size,
    a decode step as 1."""
    sizes: list[int] = []
    verify, decode = CachedLM.verify, CachedLM.decode

    def counted(self, ids):
        sizes.append(len(ids))
        return verify(self, ids)

    def decoded(self, token):
        sizes.append(1)
        return decode(self, token)
    monkeypatch.setattr(CachedLM, "verify", counted)
    monkeypatch.setattr(CachedLM, "decode", decoded)
    return sizes


@pytest.mark.parametrize("engine", ["numpy", "torch"])
def test_generate_speculates_and_writes_the_plain_greedy_text(run, capsys, passes, engine):
    argv = ["generate", str(run), "--prompt", "abcabcabc dede", "--engine", engine, *GREEDY]
    assert main(argv) == 0
    plain = capsys.readouterr().out
    assert passes == [1] * 39
    passes.clear()
    assert main([*argv, "--speculate", "4"]) == 0
    out, err = capsys.readouterr()
    assert out == plain
    assert max(passes) > 1 and len(passes) < 39  # proposals checked, and some taken
    # what it did, on stderr: the checks and proposals counted here, and the 39 tokens after
    # the first (which comes from the prompt's pass) in every pass made
    checks = [n for n in passes if n > 1]
    proposed = sum(checks) - len(checks)
    kept = 39 - len(passes)
    assert (f"sheepop: speculative decoding: {kept} of {proposed} proposed tokens kept in "
            f"{len(checks)} checks; 39 tokens in {len(passes)} passes") in err.splitlines()


def test_chat_speculates_and_answers_the_plain_greedy_text(run, capsys, passes, monkeypatch):
    def chat(*argv):
        monkeypatch.setattr(sys, "stdin", io.StringIO("abcabc\nabab\n"))
        assert main(["chat", str(run), "--engine", "numpy", *GREEDY, *argv]) == 0
        return capsys.readouterr().out
    plain = chat()
    assert set(passes) == {1}
    passes.clear()
    assert chat("--speculate", "3") == plain and len(plain.splitlines()) == 2
    assert max(passes) > 1


@pytest.mark.parametrize("value", ["-1", "65"])
def test_a_speculate_out_of_range_is_refused(run, capsys, value):
    fails(capsys, ["generate", str(run), "--prompt", "ab", "--speculate", value],
          "sample.speculate must be 0 to 64 (0: off)")
