"""The token streams a run trains on: from a prepared data directory, or from raw text.

- `DATA` a directory made by `sheepop prepare` (meta.json + train.bin/val.bin): memory-mapped;
- `DATA` a file or folder of raw documents (text, code, HTML, PDF, images, JSON Lines,
  Parquet: read by sheepop.data.ingest, the readers `sheepop prepare` uses, capped at
  data.max_bytes), or nothing (the built-in standard-library corpus, sheepop.data.corpus): a
  tokenizer trained on it (or the run's own tokenizer when resuming), encoded with EOS between
  documents, and split: the last `val_fraction` of the tokens is the validation split;
- with `data.val_data` (--val-data FILE), the validation tokens are that file's (raw text, the
  run's tokenizer) and all of DATA trains: a held-out text that stays the same whatever DATA is,
  the measure for "time to a target loss".

`Dataset.source` is the record of what DATA was (sheepop.data.source), saved with the run's
checkpoints so that `--resume` continues on the same data.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sheepop.config.schema import DataConfig
from sheepop.data import source
from sheepop.data.corpus import stdlib_texts
from sheepop.errors import UserError
from sheepop.tokenizers import Tokenizer, train_tokenizer


@dataclass
class Dataset:
    train: np.ndarray
    val: np.ndarray
    tokenizer: Tokenizer
    report: list[str] = field(default_factory=list)
    source: dict[str, Any] | None = None  # what DATA was (None: a task's own token streams)
    # Raw text only: the UTF-8 bytes of the documents read (what bits per byte divides by),
    # and, encoded with a tokenizer made elsewhere (a run's), what it cannot write.
    text_bytes: int | None = None
    unknown: Counter[str] | None = None


def encode_documents(tokenizer: Tokenizer, texts: list[str]) -> np.ndarray:
    """Concatenate the documents' ids, an EOS after each when the tokenizer has one."""
    eos = tokenizer.eos_id is not None
    ids: list[int] = []
    for ids_doc in tokenizer.encode_batch(texts, add_eos=eos):
        ids.extend(ids_doc)
    dtype = np.uint16 if tokenizer.vocab_size <= 65536 else np.uint32
    return np.asarray(ids, dtype=dtype)


def split_tokens(tokens: np.ndarray, val_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    n_val = int(len(tokens) * val_fraction)
    return tokens[: len(tokens) - n_val], tokens[len(tokens) - n_val:]


def raw_documents(path: str | Path | None, cfg: DataConfig) -> tuple[list[str], list[str]]:
    """The documents of raw-text DATA (the standard library when None) and the report lines."""
    if path is None:
        texts, corpus = stdlib_texts(cfg.max_bytes)
        return texts, [f"data: {corpus.summary()}"]
    from sheepop.data.ingest.collect import read_raw_text  # the readers' libraries load here

    raw = read_raw_text(path, cfg.max_bytes, text_field=cfg.text_field,
                        follow_links=cfg.follow_links)
    lines = raw.lines()
    return raw.texts, [f"data: {lines[0]}", *lines[1:]]


def _with_val_data(train: np.ndarray, val: np.ndarray, tokenizer: Tokenizer, cfg: DataConfig,
                   report: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(every training token, data.val_data's tokens): the held-out file replaces the split."""
    texts, lines = raw_documents(cfg.val_data, cfg)
    report.append("validation " + lines[0])
    if unknown := tokenizer.unknown_pieces(texts):
        report.append(f"note: the validation text has {sum(unknown.values()):,} characters "
                      f"the run's tokenizer cannot write (e.g. {next(iter(unknown))!r})")
    held_out = encode_documents(tokenizer, texts)
    if len(held_out) < 2:
        raise UserError(f"{cfg.val_data} encodes to {len(held_out)} tokens: too few to validate on")
    whole = train if len(val) == 0 else np.concatenate([np.asarray(train), np.asarray(val)])
    return whole, held_out


def load_dataset(path: str | Path | None, cfg: DataConfig,
                 tokenizer: Tokenizer | None = None) -> Dataset:
    if path is not None and Path(path).is_dir() and (Path(path) / "meta.json").exists():
        from sheepop.data.shards import open_prepared  # only needed for prepared data
        prepared = open_prepared(path)
        if tokenizer is not None and tokenizer.to_json() != prepared.tokenizer.to_json():
            raise UserError(f"{path} was prepared with another tokenizer than this run's")
        report = [f"data: {path} (prepared: {len(prepared.train):,} train and "
                  f"{len(prepared.val):,} val tokens)"]
        train, val = prepared.train, prepared.val
        if cfg.val_data:
            train, val = _with_val_data(train, val, prepared.tokenizer, cfg, report)
        return Dataset(train, val, prepared.tokenizer, report, source.describe(path))
    texts, report = raw_documents(path, cfg)
    unknown = None
    if tokenizer is None:
        tokenizer = train_tokenizer(cfg.tokenizer, texts, cfg.vocab_size)
        report.append(f"tokenizer: {cfg.tokenizer}, {tokenizer.vocab_size} ids, trained on it")
    else:
        unknown = tokenizer.unknown_pieces(texts)
    tokens = encode_documents(tokenizer, texts)
    if len(tokens) == 0:
        raise UserError("the data encodes to no tokens")
    train, val = split_tokens(tokens, 0.0 if cfg.val_data else cfg.val_fraction)
    if cfg.val_data:
        train, val = _with_val_data(train, val, tokenizer, cfg, report)
    report.append(f"tokens: {len(train):,} train, {len(val):,} val")
    text_bytes = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts)
    return Dataset(train, val, tokenizer, report, source.describe(path), text_bytes, unknown)
