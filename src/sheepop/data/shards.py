"""The prepared data directory: token streams the training loop memory-maps, and their record.

    DATA_DIR/train.bin        flat little-endian token ids, EOS after every document
    DATA_DIR/val.bin          the same for the validation documents (may be empty)
    DATA_DIR/tokenizer.json   the tokenizer that made them (sheepop.tokenizers format)
    DATA_DIR/meta.json        {"format": "sheepop-shards", "version": 1, "dtype": "uint16",
                               "vocab_size", "train_tokens", "val_tokens", "files": [...],
                               "summary": {...}, ...}

Ids are uint16 when the vocabulary has at most 65536 ids (every id fits in 16 bits), else
uint32; the layout nanoGPT and llm.c use, read with `np.memmap` so a corpus larger than memory
costs nothing to open. This module writes the pieces (`TokenWriter`, `write_meta`) and reads a
directory back (`open_prepared`), checking everything it can cheaply.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from sheepop.errors import UserError
from sheepop.files import DocumentFormat, atomic_open, read_document
from sheepop.tokenizers import Tokenizer, load

FORMAT = "sheepop-shards"
VERSION = 1
META_DOCUMENT = DocumentFormat(FORMAT, VERSION, "sheepop data file")
TRAIN_FILE = "train.bin"
VAL_FILE = "val.bin"
TOKENIZER_FILE = "tokenizer.json"
META_FILE = "meta.json"
_DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}


def token_dtype_name(vocab_size: int) -> str:
    """'uint16' when every id 0..vocab_size-1 fits in 16 bits, else 'uint32'."""
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def numpy_dtype(name: str) -> np.dtype:
    """The little-endian NumPy dtype of a meta.json dtype name ("uint16" | "uint32")."""
    return _DTYPES[name]


class TokenWriter:
    """Append token ids to a .bin file as they come (little-endian, the given dtype)."""

    def __init__(self, path: str | Path, dtype_name: str) -> None:
        self.path = Path(path)
        self.dtype = _DTYPES[dtype_name]
        self.tokens = 0
        self._f: IO[bytes] = open(self.path, "wb")  # noqa: SIM115 (closed by close())

    def write(self, ids: np.ndarray | list[int]) -> None:
        arr = np.asarray(ids)
        if arr.dtype != self.dtype:
            arr = arr.astype(self.dtype)
        self._f.write(arr.tobytes())
        self.tokens += int(arr.size)

    def write_bytes(self, data: bytes) -> None:
        """Ids already in this file's dtype and byte order."""
        self._f.write(data)
        self.tokens += len(data) // self.dtype.itemsize

    def close(self) -> None:
        if not self._f.closed:
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()


def write_meta(path: str | Path, header: dict[str, Any], files: Iterable[dict[str, Any]],
               summary: dict[str, Any]) -> None:
    """meta.json, streamed and atomic: "format" and "version", then `header`, then "files"
    (one line each; an iterable, so a million files never sit in memory as one JSON string),
    then "summary"."""
    header = {"format": FORMAT, "version": VERSION, **header}
    with atomic_open(path, "w") as f:
        f.write("{\n")
        for key, value in header.items():
            f.write(f" {json.dumps(key)}: {json.dumps(value, ensure_ascii=False)},\n")
        f.write(' "files": [')
        for n, entry in enumerate(files):
            f.write(("," if n else "") + "\n  " + json.dumps(entry, ensure_ascii=False))
        f.write("\n ],\n")
        f.write(f' "summary": {json.dumps(summary, ensure_ascii=False, indent=1)}\n}}\n')


@dataclass
class PreparedData:
    train: np.ndarray   # np.memmap of token ids (uint16 or uint32), read-only
    val: np.ndarray     # may be empty (length 0)
    tokenizer: Tokenizer
    meta: dict


def is_prepared_dir(path: str | Path) -> bool:
    """True when `path` is a directory holding a readable "sheepop-shards" meta.json."""
    path = Path(path)
    if not (path / META_FILE).is_file():
        return False
    try:
        read_document(path / META_FILE, META_DOCUMENT)
    except UserError:
        return False
    return True


def _tokens(path: Path, dtype: np.dtype, expected: Any, where: str) -> np.ndarray:
    name = path.name
    if not path.is_file():
        raise UserError(f"{where}: {name} is missing (run `sheepop prepare` again)")
    size = path.stat().st_size
    if type(expected) is not int or expected < 0:
        raise UserError(f"{where}: meta.json has no valid token count for {name}")
    if size != expected * dtype.itemsize:
        raise UserError(f"{where}: {name} holds {size} bytes but meta.json promises "
                        f"{expected} tokens of {dtype.itemsize} bytes (truncated or replaced?)")
    if size == 0:
        return np.zeros(0, dtype=dtype)  # np.memmap cannot map an empty file
    return np.memmap(path, dtype=dtype, mode="r")


def open_prepared(path: str | Path) -> PreparedData:
    """Open a directory written by `sheepop prepare`; UserError, one line, when anything is
    missing or does not add up."""
    path = Path(path)
    where = str(path)
    if not path.exists():
        raise UserError(f"data directory not found: {where}")
    if not path.is_dir():
        raise UserError(f"{where} is not a directory prepared by `sheepop prepare`")
    meta = read_document(path / META_FILE, META_DOCUMENT,
                         f"{where}: no meta.json (not a directory made by `sheepop prepare`)")
    dtype = _DTYPES.get(meta.get("dtype"))  # type: ignore[arg-type]
    if dtype is None:
        raise UserError(f"{where}: meta.json dtype must be uint16 or uint32, "
                        f"got {meta.get('dtype')!r}")
    if not (path / TOKENIZER_FILE).is_file():
        raise UserError(f"{where}: tokenizer.json is missing")
    tokenizer = load(path / TOKENIZER_FILE)
    if meta.get("vocab_size") != tokenizer.vocab_size:
        raise UserError(f"{where}: meta.json says vocab_size {meta.get('vocab_size')} but "
                        f"tokenizer.json has {tokenizer.vocab_size}")
    if token_dtype_name(tokenizer.vocab_size) == "uint32" and dtype.itemsize == 2:
        raise UserError(f"{where}: a vocabulary of {tokenizer.vocab_size} does not fit uint16")
    train = _tokens(path / TRAIN_FILE, dtype, meta.get("train_tokens"), where)
    val = _tokens(path / VAL_FILE, dtype, meta.get("val_tokens"), where)
    return PreparedData(train=train, val=val, tokenizer=tokenizer, meta=meta)
