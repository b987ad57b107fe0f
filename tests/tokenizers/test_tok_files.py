"""Every way a tokenizer file can be wrong, and training's argument errors (the `sheepop
tokenizer` commands are tested in tests/cli/)."""

from __future__ import annotations

import json

import pytest
from tok_samples import PROSE

from sheepop.errors import UserError
from sheepop.tokenizers import load, loads, train_tokenizer


def test_every_kind_loads_back_identically(tmp_path):
    for kind, options in [("char", {}), ("word", {}), ("bpe", {"vocab_size": 300}),
                          ("digits", {"special_tokens": ["<|eos|>"]})]:
        tok = train_tokenizer(kind, ["12 34 " + PROSE if kind != "digits" else "12 34"],
                              **options)
        text = json.loads(tok.to_json())
        assert (text["format"], text["version"], text["kind"]) == ("sheepop-tokenizer", 1, kind)
        tok.save(tmp_path / f"{kind}.json")
        assert load(tmp_path / f"{kind}.json").to_json() == tok.to_json()
    assert not list(tmp_path.glob(".*.tmp"))  # atomic writes leave no temporary files


def test_load_errors(tmp_path):
    with pytest.raises(UserError, match="tokenizer file not found"):
        load(tmp_path / "missing.json")
    with pytest.raises(UserError, match="is a directory"):
        load(tmp_path)
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(UserError, match="not UTF-8"):
        load(tmp_path / "bin.json")
    with pytest.raises(UserError, match="t.json is not valid JSON"):
        loads("{", where="t.json")
    with pytest.raises(UserError, match="not a sheepop tokenizer file"):
        loads('{"format": "sheepop-run", "version": 1}')
    with pytest.raises(UserError, match="Hugging Face tokenizer.json"):
        loads('{"version": "1.0", "model": {}, "added_tokens": []}')
    good = json.loads(train_tokenizer("char", ["ab"]).to_json())
    with pytest.raises(UserError, match="format version 2 is newer than this sheepop reads "
                                        r"\(up to 1\): upgrade sheepop"):
        loads(json.dumps(dict(good, version=2)))
    with pytest.raises(UserError, match="no valid version"):
        loads(json.dumps(dict(good, version="1")))
    with pytest.raises(UserError, match="unknown tokenizer kind 'sentencepiece'"):
        loads(json.dumps(dict(good, kind="sentencepiece")))


@pytest.mark.parametrize("kind, field, value, message", [
    ("char", "chars", ["ab"], "single characters"),
    ("char", "chars", ["a", "a"], "twice"),
    ("char", "special_tokens", {"<|bos|>": 0, "<|eos|>": 5}, "exactly 0..vocab_size-1"),
    ("word", "words", "abc", "list of non-empty strings"),
    ("digits", "alphabet", "0123456789", "digits alphabet"),
    ("bpe", "merges", [["a", "b", "c"]], "string pairs"),
    ("bpe", "merges", [["x", "y"]], "does not join"),
    ("bpe", "tokens", ["a"], "special token's id"),
    ("bpe", "pattern", "(", "invalid pre-split pattern"),
])
def test_corrupt_payloads(kind, field, value, message):
    good = json.loads(train_tokenizer(kind, ["ab ab" if kind != "digits" else "1"],
                                      **({"vocab_size": 300} if kind == "bpe" else {})).to_json())
    with pytest.raises(UserError, match=message):
        loads(json.dumps(dict(good, **{field: value})))


def test_train_tokenizer_errors():
    with pytest.raises(UserError, match="unknown tokenizer kind 'bytes'"):
        train_tokenizer("bytes", ["a"])
    with pytest.raises(UserError, match="empty corpus"):
        train_tokenizer("char", ["", ""])
    with pytest.raises(UserError, match="empty corpus"):
        train_tokenizer("word", [" \t "])
    with pytest.raises(UserError, match="empty corpus"):
        train_tokenizer("digits", [])
    with pytest.raises(UserError, match="vocab_size must be a non-negative"):
        train_tokenizer("char", ["a"], vocab_size=-1)
    with pytest.raises(UserError, match="unexpected keyword argument 'min_freq'"):
        train_tokenizer("char", ["a"], min_freq=2)
