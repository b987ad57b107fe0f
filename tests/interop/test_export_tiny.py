"""The first model a user trains reaches Hugging Face: the `tiny` preset (sinusoidal positions, the
exact GELU, a char tokenizer) exported with `--to hf-gpt2` is a GPT2LMHeadModel whose wpe is the
scaled sinusoidal table, beside a tokenizer.json that transformers loads to the same ids; the
char and word tokenizers' tokenizer.json give `tokenizers` the same ids as sheepop."""

from __future__ import annotations

import json

import pytest

from sheepop.cli import main
from sheepop.tokenizers import train_tokenizer
from sheepop.tokenizers.hf import to_hf_dict

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

CORPUS = ("def add(a, b):\n    return a + b\n\nprint(add(2, 3))  # 5\n"
          "class Point:\n    x: int = 0\n    y: int = 0\n") * 40
HARD = ("Hello <|eos|> wörld 漢字 — \"quoted\", (bracketed) don't\n\n  x\t\ty;"
        "<|unk|> < | a | > 12.5% !?")


@pytest.mark.parametrize("kind, options", [("char", {}), ("word", {}),
                                           ("word", {"lowercase": True})])
def test_char_and_word_tokenizer_json_give_the_same_ids(kind, options):
    tok = train_tokenizer(kind, [CORPUS + "Hello"], **options)
    hf = tokenizers.Tokenizer.from_str(json.dumps(to_hf_dict(tok)))
    for text in (CORPUS[:500], HARD, "", "\n", "Unseen WORDS everywhere"):
        assert hf.encode(text).ids == tok.encode(text), text
    ids = tok.encode(CORPUS[:300])
    if kind == "char":  # the Fuse decoder: decoding is exact
        assert hf.decode(ids, skip_special_tokens=False) == tok.decode(ids) == CORPUS[:300]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """`make run`'s model (the tiny preset on the built-in data), trained for a few steps."""
    run = tmp_path_factory.mktemp("tiny") / "run"
    assert main(["train", "--preset", "tiny", "--steps", "8", "--out", str(run),
                 "--no-progress", "--set", "train.batch_size=4", "--set", "train.warmup_steps=2",
                 "--set", "train.eval_batches=1", "--set", "train.threads=1",
                 "--set", "data.max_bytes=50000"]) == 0
    return run


def test_the_tiny_preset_exported_generates_the_same_greedy_text_in_transformers(
        tiny_run, tmp_path, capsys):
    out = tmp_path / "hf"
    assert main(["export", str(tiny_run), "--to", "hf-gpt2", str(out)]) == 0
    assert "model only" not in capsys.readouterr().err  # the tokenizer was written too
    assert {"config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json"} <= {p.name for p in out.iterdir()}

    prompt, n = "def ", 60
    assert main(["generate", str(tiny_run), "--prompt", prompt, "--temperature", "0",
                 "--max-new-tokens", str(n), "--engine", "torch"]) == 0
    ours = capsys.readouterr().out.rstrip("\n")

    tok = transformers.AutoTokenizer.from_pretrained(out)
    model = transformers.GPT2LMHeadModel.from_pretrained(out).eval()
    assert model.config.activation_function == "gelu"  # the exact GELU of the tiny preset
    ids = tok(prompt, return_tensors="pt")["input_ids"]
    generated = model.generate(ids, max_new_tokens=n, do_sample=False, pad_token_id=0,
                               eos_token_id=None)
    theirs = tok.decode(generated[0], skip_special_tokens=False)
    assert len(theirs) > len(prompt) + 20
    assert ours == theirs


def test_export_names_the_format_that_takes_the_model(tiny_run, tmp_path, capsys):
    assert main(["export", str(tiny_run), "--to", "hf-llama", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("sheepop: error: cannot export as Llama: model.pos_encoding=sinusoidal "
                   "(Llama has rotary positions: rope) (--to hf-gpt2 takes this model)")
    assert not (tmp_path / "o").exists()
