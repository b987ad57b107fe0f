"""The prepared directory's reader: memory maps, and one clear line for anything wrong."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sheepop.data.ingest.store import DocWriter, document_pieces, read_document
from sheepop.data.shards import (
    TokenWriter,
    is_prepared_dir,
    open_prepared,
    token_dtype_name,
    write_meta,
)
from sheepop.errors import UserError
from sheepop.tokenizers import train_tokenizer


def _make(path, train=(5, 6, 1), val=(7, 1), dtype="uint16", **meta_overrides):
    path.mkdir()
    tok = train_tokenizer("char", ["abc"])
    tok.save(path / "tokenizer.json")
    for name, ids in (("train.bin", train), ("val.bin", val)):
        writer = TokenWriter(path / name, dtype)
        writer.write(np.array(ids))
        writer.close()
    header = {"format": "sheepop-shards", "version": 1, "dtype": dtype,
              "vocab_size": tok.vocab_size, "train_tokens": len(train), "val_tokens": len(val)}
    header.update(meta_overrides)
    write_meta(path / "meta.json", header, [{"path": "a.txt", "tokens": 3}], {"files": 1})
    return tok


def test_round_trip_read_only_memmap(tmp_path):
    tok = _make(tmp_path / "d")
    data = open_prepared(tmp_path / "d")
    assert data.train.tolist() == [5, 6, 1] and data.val.tolist() == [7, 1]
    assert isinstance(data.train, np.memmap) and data.train.dtype == np.uint16
    assert (tmp_path / "d" / "train.bin").read_bytes() == b"\x05\x00\x06\x00\x01\x00"
    with pytest.raises(ValueError):
        data.train[0] = 1
    assert data.tokenizer.to_json() == tok.to_json()
    assert data.meta["files"] == [{"path": "a.txt", "tokens": 3}]
    assert data.meta["summary"] == {"files": 1}
    assert is_prepared_dir(tmp_path / "d") and not is_prepared_dir(tmp_path)


def test_empty_val_and_uint32(tmp_path):
    _make(tmp_path / "d", val=(), dtype="uint32")
    data = open_prepared(tmp_path / "d")
    assert data.val.size == 0 and data.train.dtype == np.uint32
    assert (tmp_path / "d" / "train.bin").read_bytes()[:4] == b"\x05\x00\x00\x00"


def test_dtype_follows_vocabulary_size():
    assert token_dtype_name(256) == "uint16"
    assert token_dtype_name(65536) == "uint16"   # ids 0..65535 fit 16 bits
    assert token_dtype_name(65537) == "uint32"


def _break(path, what):
    if what == "no meta":
        (path / "meta.json").unlink()
    elif what == "bad json":
        (path / "meta.json").write_text("{not json")
    elif what == "no tokenizer":
        (path / "tokenizer.json").unlink()
    elif what == "truncated":
        data = (path / "train.bin").read_bytes()
        (path / "train.bin").write_bytes(data[:-1])
    elif what == "no val":
        (path / "val.bin").unlink()
    else:
        meta = json.loads((path / "meta.json").read_text())
        meta.update(what)
        (path / "meta.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("what,message", [
    ("no meta", "no meta.json"),
    ("bad json", "meta.json is not valid JSON"),
    ("no tokenizer", "tokenizer.json is missing"),
    ("truncated", "train.bin holds 5 bytes but meta.json promises 3 tokens"),
    ("no val", "val.bin is missing"),
    ({"format": "other"}, "not a sheepop data file"),
    ({"version": 99}, "version 99 is newer"),
    ({"dtype": "int8"}, "dtype must be uint16 or uint32"),
    ({"vocab_size": 3}, "vocab_size 3 but tokenizer.json has 7"),
    ({"train_tokens": -1}, "no valid token count for train.bin"),
])
def test_damage_is_one_clear_line(tmp_path, what, message):
    _make(tmp_path / "d")
    _break(tmp_path / "d", what)
    with pytest.raises(UserError) as e:
        open_prepared(tmp_path / "d")
    assert message in str(e.value) and "\n" not in str(e.value)


def test_missing_directory_and_file(tmp_path):
    with pytest.raises(UserError, match="data directory not found"):
        open_prepared(tmp_path / "nope")
    (tmp_path / "f").write_text("x")
    with pytest.raises(UserError, match="is not a directory"):
        open_prepared(tmp_path / "f")


def test_store_commit_rollback_and_pieces(tmp_path):
    writer = DocWriter(tmp_path / "s.txt")
    writer.begin()
    writer.write("first\r\ndoc\u0065\u0301\n")
    first = writer.commit()
    writer.begin()
    writer.write("dropped")
    writer.rollback()
    writer.begin()
    writer.write("é" * 10 + "\nline two\nline three")
    second = writer.commit()
    writer.close()
    assert read_document(tmp_path / "s.txt", *first[:2]) == "first\ndoc\u00e9\n"
    assert second[0] == first[1]  # the rolled-back text is gone
    assert read_document(tmp_path / "s.txt", *second[:2]) == "é" * 10 + "\nline two\nline three"
    pieces = list(document_pieces(tmp_path / "s.txt", second[0], second[1], 16))
    texts = [read_document(tmp_path / "s.txt", o, n) for o, n in pieces]
    assert "".join(texts) == "é" * 10 + "\nline two\nline three"
    # cut after a newline found just past 16 bytes; else at 16 bytes (a character boundary)
    assert texts == ["é" * 10 + "\n", "line two\nline th", "ree"]
    no_newline = list(document_pieces(tmp_path / "s.txt", second[0], 21, 5))
    assert [read_document(tmp_path / "s.txt", o, n) for o, n in no_newline] == [
        "ééé", "ééé", "ééé", "é\n"]  # never inside a two-byte character
