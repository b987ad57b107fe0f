"""`sheepop tokenizer ...` commands (the tokenizer files themselves: tests/tokenizers/)."""

from __future__ import annotations

import argparse
import io

import pytest
from tok_samples import PROSE

from sheepop.cli import tokenizer as cli
from sheepop.errors import UserError
from sheepop.tokenizers import load, train_tokenizer


def sheepop_tokenizer(*argv: str) -> int:
    """Run `sheepop tokenizer ARGV...` through this command module's own parser."""
    parser = argparse.ArgumentParser(prog="sheepop")
    cli.register(parser.add_subparsers())
    args = parser.parse_args(["tokenizer", *map(str, argv)])
    return args.func(args)


@pytest.fixture()
def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text(PROSE * 5, encoding="utf-8")
    return path


def test_train_encode_decode_info(corpus, tmp_path, capsys, monkeypatch):
    out = tmp_path / "tok.json"
    assert sheepop_tokenizer("train", corpus, "--kind", "bpe", "--vocab-size", 300,
                             "--out", out) == 0
    assert "bpe tokenizer: 300 ids (3 special)" in capsys.readouterr().out
    tok = load(out)
    assert sheepop_tokenizer("encode", out, "fox 😀", "--eos") == 0
    ids = tok.encode("fox 😀", add_eos=True)
    assert capsys.readouterr().out == " ".join(map(str, ids)) + "\n"
    monkeypatch.setattr("sys.stdin", io.StringIO("The fox\n"))
    assert sheepop_tokenizer("encode", out, "-") == 0
    assert capsys.readouterr().out.split() == [str(i) for i in tok.encode("The fox\n")]
    assert sheepop_tokenizer("decode", out, *ids) == 0
    assert capsys.readouterr().out == "fox 😀<|eos|>\n"
    assert sheepop_tokenizer("decode", out, "--skip-special", *ids) == 0
    assert capsys.readouterr().out == "fox 😀\n"
    assert sheepop_tokenizer("info", out, "--show", 2) == 0
    info = capsys.readouterr().out
    assert "kind:           bpe" in info and "merges:         41" in info
    assert "<|bos|>=297, <|eos|>=298, <|pad|>=299" in info


@pytest.mark.parametrize("kind, size", [("char", 0), ("word", 0), ("digits", 0)])
def test_train_every_kind(tmp_path, kind, size, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("12 34 567\n" if kind == "digits" else PROSE, encoding="utf-8")
    assert sheepop_tokenizer("train", corpus, "--kind", kind, "--out", tmp_path / "t.json") == 0
    assert load(tmp_path / "t.json").kind == kind


def test_export_and_import(corpus, tmp_path, capsys):
    out = tmp_path / "tok.json"
    sheepop_tokenizer("train", corpus, "--vocab-size", 320, "--out", out)
    assert sheepop_tokenizer("export", out, "--to", "hf", tmp_path / "hf.json") == 0
    from tokenizers import Tokenizer as HFTokenizer
    hf = HFTokenizer.from_file(str(tmp_path / "hf.json"))
    assert hf.encode(PROSE).ids == load(out).encode(PROSE)
    assert sheepop_tokenizer("export", out, "--to", "gpt2", tmp_path / "g") == 0
    assert sheepop_tokenizer("import", "--gpt2", tmp_path / "g" / "vocab.json",
                             tmp_path / "g" / "merges.txt", "--out", tmp_path / "back.json",
                             "--special", "<|bos|>", "--special", "<|eos|>",
                             "--special", "<|pad|>") == 0
    back = load(tmp_path / "back.json")
    assert back.encode(PROSE) == load(out).encode(PROSE) == hf.encode(PROSE).ids


def test_cli_user_errors(corpus, tmp_path):
    with pytest.raises(UserError, match="corpus file not found"):
        sheepop_tokenizer("train", tmp_path / "missing.txt", "--out", tmp_path / "t.json")
    with pytest.raises(UserError, match="is a folder"):
        sheepop_tokenizer("train", tmp_path, "--out", tmp_path / "t.json")
    (tmp_path / "latin1.txt").write_bytes("café".encode("latin-1"))
    with pytest.raises(UserError, match="not UTF-8"):
        sheepop_tokenizer("train", tmp_path / "latin1.txt", "--out", tmp_path / "t.json")
    sheepop_tokenizer("train", corpus, "--kind", "char", "--out", tmp_path / "c.json")
    with pytest.raises(UserError, match="not a token id: 'x'"):
        sheepop_tokenizer("decode", tmp_path / "c.json", "1", "x")
    with pytest.raises(UserError, match="outside the vocabulary"):
        sheepop_tokenizer("decode", tmp_path / "c.json", "100000")
    # (a char tokenizer has a Hugging Face tokenizer.json since the tiny preset exports: issue
    # 32, item 5; GPT-2's vocab.json + merges.txt are byte-level BPE's only)
    with pytest.raises(UserError, match="only bpe tokenizers have GPT-2 files"):
        sheepop_tokenizer("export", tmp_path / "c.json", "--to", "gpt2", tmp_path / "g")


def test_main_turns_a_user_error_into_one_line_and_status_2(tmp_path, capsys):
    from sheepop.cli import main
    train_tokenizer("char", ["abc"]).save(tmp_path / "c.json")
    assert main(["tokenizer", "decode", str(tmp_path / "c.json"), "0", "99"]) == 2
    err = capsys.readouterr().err
    assert err == "sheepop: error: token id 99 is outside the vocabulary of this char " \
                  "tokenizer (ids 0..6)\n"
    assert main(["tokenizer", "encode", str(tmp_path / "c.json"), "cab"]) == 0
    assert capsys.readouterr().out == "6 4 5\n"
