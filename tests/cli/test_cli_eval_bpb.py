"""`sheepop eval`: loss, perplexity and bits per byte, the bytes being those of exactly the text
whose tokens were scored; --json parsed and checked against a direct computation."""

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from sheepop.checkpoint import format as checkpoint
from sheepop.cli import main
from sheepop.config.schema import Config, ModelConfig
from sheepop.model import GPT
from sheepop.tokenizers import train_tokenizer

# NFC text with "\n" line ends (ingestion leaves it as it is), ASCII and 2- and 3-byte characters.
TEXT = "Le café de Zoé (à Paris), naïve.\n日本の猫, it said.\n" * 6
T = 16
pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: see tests/conftest.py


def make_run(path, kind: str):
    tok = train_tokenizer(kind, [TEXT], **({"vocab_size": 300} if kind == "bpe" else {}))
    cfg = Config()
    cfg.model = ModelConfig(vocab_size=tok.vocab_size, block_size=T, n_layer=1, n_head=2,
                            n_embd=16)
    torch.manual_seed(0)
    model = GPT(cfg.model)
    checkpoint.save_checkpoint(path, model.numpy_weights(), cfg.to_dict(), tok.to_json())
    return model.eval(), tok


def eval_json(capsys, run, data, *options) -> dict:
    assert main(["eval", str(run), "--data", str(data), "--json", *options]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("kind", ["char", "bpe", "word"])
def test_eval_json_counts_the_bytes_of_the_scored_text(kind, tmp_path, capsys):
    model, tok = make_run(tmp_path / "run", kind)
    (tmp_path / "text.txt").write_text(TEXT, encoding="utf-8")
    out = eval_json(capsys, tmp_path / "run", tmp_path / "text.txt")
    ids = tok.encode(TEXT, add_eos=True)  # one document, then EOS
    first = tok.decode(ids[:1]).encode("utf-8")
    assert TEXT.startswith(first.decode())
    # every target is scored: the text after the first token, then the EOS (no bytes)
    assert out["tokens"] == len(ids) - 1
    assert out["bytes"] == len(TEXT.encode("utf-8")) - len(first)
    assert out["windows"] == math.ceil((len(ids) - 1) / T)
    # the loss, recomputed from the model's logits window by window
    stream = torch.tensor(ids)
    nats = 0.0
    with torch.no_grad():
        for s in range(0, len(ids) - 1, T):
            x, y = stream[s:s + T], stream[s + 1:s + T + 1]
            logits, _ = model(x[None, :len(y)])
            nats += F.cross_entropy(logits[0].double(), y, reduction="sum").item()
    assert out["loss"] == pytest.approx(nats / out["tokens"], rel=1e-5)
    assert out["perplexity"] == pytest.approx(math.exp(out["loss"]), rel=1e-12)
    assert out["bits_per_byte"] == pytest.approx(
        out["loss"] * out["tokens"] / (math.log(2) * out["bytes"]), rel=1e-12)


def test_max_windows_counts_only_the_windows_evaluated(tmp_path, capsys):
    make_run(tmp_path / "run", "char")
    (tmp_path / "text.txt").write_text(TEXT, encoding="utf-8")
    one = eval_json(capsys, tmp_path / "run", tmp_path / "text.txt", "--max-windows", "1")
    # the first window's targets: characters 1..T of the text, "e café de Zoé (à" (é é à: 2
    # bytes each), not the whole text
    assert (one["windows"], one["tokens"]) == (1, T)
    assert one["bytes"] == len(TEXT[1:T + 1].encode("utf-8")) == T + 3
    assert main(["eval", str(tmp_path / "run"), "--data", str(tmp_path / "text.txt"),
                 "--max-windows", "1"]) == 0
    line = capsys.readouterr().out.strip()
    assert line == (f"{T} tokens ({T + 3} bytes) in 1 window: loss {one['loss']:.4f} "
                    f"nats/token, perplexity {one['perplexity']:.3f}, "
                    f"{one['bits_per_byte']:.4f} bits/byte")


def test_ascii_char_text_bits_per_byte_is_loss_over_ln2(tmp_path, capsys):
    make_run(tmp_path / "run", "char")
    ascii_text = "Le caf de Zo (a Paris), naive.\n" * 6  # all in the vocabulary, 1 byte each
    (tmp_path / "text.txt").write_text(ascii_text, encoding="utf-8")
    out = eval_json(capsys, tmp_path / "run", tmp_path / "text.txt")
    assert out["bytes"] == len(ascii_text) - 1 == out["tokens"] - 1  # the EOS has no byte
    assert out["bits_per_byte"] == pytest.approx(
        out["loss"] / math.log(2) * out["tokens"] / out["bytes"], rel=1e-12)
    assert np.isfinite(out["bits_per_byte"]) and out["bits_per_byte"] > out["loss"] / math.log(2)


@pytest.mark.parametrize("engine", ["numpy", "torch"])
def test_a_loss_past_709_nats_has_an_infinite_perplexity(tmp_path, capsys, engine):
    """e^L is past float64's range for L > 709.78 nats/token: the perplexity is inf in the
    sentence and null in --json (math.exp raised OverflowError, a traceback), the loss and
    bits per byte as they are. A head scaled by 1e4 puts the loss in the thousands."""
    tok = train_tokenizer("char", [TEXT])
    cfg = Config()
    cfg.model = ModelConfig(vocab_size=tok.vocab_size, block_size=T, n_layer=1, n_head=2,
                            n_embd=16, tie_weights=False)
    torch.manual_seed(0)
    weights = GPT(cfg.model).numpy_weights()
    weights["head.weight"] *= 1e4
    checkpoint.save_checkpoint(tmp_path / "run", weights, cfg.to_dict(), tok.to_json())
    (tmp_path / "text.txt").write_text(TEXT, encoding="utf-8")
    out = eval_json(capsys, tmp_path / "run", tmp_path / "text.txt", "--engine", engine)
    assert out["loss"] > 1000 and out["perplexity"] is None
    assert out["bits_per_byte"] == pytest.approx(
        out["loss"] * out["tokens"] / (math.log(2) * out["bytes"]), rel=1e-12)
    assert main(["eval", str(tmp_path / "run"), "--data", str(tmp_path / "text.txt"),
                 "--engine", engine]) == 0
    assert f"loss {out['loss']:.4f} nats/token, perplexity inf, " in capsys.readouterr().out
