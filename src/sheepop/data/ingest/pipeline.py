"""`prepare`: files -> documents -> tokenizer -> train.bin / val.bin / meta.json, streamed.

    1. discover   walk the inputs (discovery.py)
    2. extract    worker processes turn each file into normalised documents (one per file; one
                  per line or row for JSON Lines and Parquet) in their own store file
                  (extract.py); the parent drops exact duplicates by hash (doctable.py)
    3. split      documents to train / val, seeded, by document
    4. tokenizer  trained on (a seeded sample of) the train documents (char: on all of them,
                  validation included), or loaded from a file
    5. tokenize   worker processes encode tasks of ~4 MB; the parent appends the ids, in
                  document order, to train.bin / val.bin, each document followed by EOS
    6. meta.json  per-file records (spooled to disk while running) with their token counts

Memory holds a few numbers per document and the file list, never the text. Workers come from
sheepop's one process pool (tokenizers/parallel.py: spawned, and why). Everything is
written in a temporary folder next to DATA_DIR and renamed at the end (outdir.py). The ids
written do not depend on --workers: tasks are handed out and collected in order.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from sheepop.data.ingest import extract, outdir, tokenizing
from sheepop.data.ingest.discovery import discover
from sheepop.data.ingest.doctable import DocTable
from sheepop.data.ingest.record import printable
from sheepop.data.ingest.report import Summary
from sheepop.data.ingest.store import document_pieces, read_document
from sheepop.data.shards import (
    FORMAT,
    META_FILE,
    TOKENIZER_FILE,
    TRAIN_FILE,
    VAL_FILE,
    VERSION,
    TokenWriter,
    token_dtype_name,
    write_meta,
)
from sheepop.errors import UserError
from sheepop.tokenizers import EOS, KINDS, Tokenizer, load, train_tokenizer
from sheepop.tokenizers.parallel import imap_ordered
from sheepop.words import plural

SPOOL = "files.jsonl"
_OCR_LANG = re.compile(r"[A-Za-z][A-Za-z_]*(\+[A-Za-z][A-Za-z_]*)*")


@dataclass
class PrepareOptions:
    inputs: list[str]
    out: str
    tokenizer: str = "char"          # a kind (char, word, bpe, digits) or a tokenizer.json
    vocab_size: int = 0
    include: list[str] = field(default_factory=list)
    exclude: list[str] = field(default_factory=list)
    hidden: bool = False
    follow_links: bool = False          # also read links leading outside the inputs
    workers: int = 1
    ocr_lang: str = "eng"
    text_field: str = "text"          # JSON Lines / Parquet: key, column or dotted path
    val_fraction: float = 0.1
    seed: int = 1337
    overwrite: bool = False
    tokenizer_sample_mb: float = 256.0  # 0: train the tokenizer on the whole train split
    progress: bool | None = None        # None: a bar when stderr is a terminal

    def check(self) -> None:
        if not self.inputs:
            raise UserError("give at least one input file or folder")
        if not 0.0 <= self.val_fraction < 1.0:
            raise UserError(f"--val-fraction must be in [0, 1), got {self.val_fraction}")
        if self.workers < 1:
            raise UserError(f"--workers must be at least 1, got {self.workers}")
        if self.vocab_size < 0:
            raise UserError(f"--vocab-size must be >= 0, got {self.vocab_size}")
        if not math.isfinite(self.tokenizer_sample_mb) or self.tokenizer_sample_mb < 0:
            # nan passes `< 0` and would cap the sample at nan bytes
            raise UserError(f"--tokenizer-sample-mb must be a finite number >= 0 (0: all), got "
                            f"{self.tokenizer_sample_mb}")
        if not _OCR_LANG.fullmatch(self.ocr_lang):
            raise UserError(f"--ocr-lang must look like 'eng' or 'eng+fra', got "
                            f"{self.ocr_lang!r}")
        if not self.text_field or any(not part for part in self.text_field.split(".")):
            raise UserError(f"--text-field must be a name or a dotted path such as meta.body, "
                            f"got {self.text_field!r}")
        if self.tokenizer not in KINDS and not Path(self.tokenizer).is_file():
            raise UserError(f"--tokenizer must be one of {', '.join(KINDS)} or an existing "
                            f"tokenizer.json, got {self.tokenizer!r}")


@dataclass
class PrepareResult:
    out: Path
    summary: Summary
    tokenizer: Tokenizer


def _bar(opts: PrepareOptions, total: int, desc: str) -> tqdm:
    disable = None if opts.progress is None else not opts.progress
    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
                disable=disable, dynamic_ncols=True, smoothing=0.05)


def _extract(opts: PrepareOptions, tmp: Path, summary: Summary, spool) -> DocTable:
    found = discover(opts.inputs, opts.include, opts.exclude, opts.hidden,
                     avoid=[opts.out, tmp], follow_links=opts.follow_links)
    summary.excluded = found.excluded
    for record in found.skipped:
        summary.add(record)
        spool.write(json.dumps(record.to_meta(), ensure_ascii=False) + "\n")
    docs = DocTable()
    chunksize = max(1, min(32, len(found.tasks) // (opts.workers * 8)))
    options = extract.ExtractOptions(ocr_lang=opts.ocr_lang, text_field=opts.text_field)
    try:
        with _bar(opts, found.total_bytes, "extract") as bar:
            results = imap_ordered(extract.extract_file, found.tasks, opts.workers,
                                   extract.init_worker, (str(tmp), options), chunksize)
            for n, record in enumerate(results, 1):
                found.mark_outside(record)
                first, end = docs.add_file(record)
                summary.add(record)
                entry = record.to_meta()
                if end > first:
                    entry["_docs"] = [first, end]
                spool.write(json.dumps(entry, ensure_ascii=False) + "\n")
                bar.update(record.bytes)
                bar.set_postfix_str(f"{n}/{len(found.tasks)} files", refresh=False)
    finally:
        extract.close_worker()  # the in-process store of --workers 1 (a no-op otherwise)
    return docs


def _split(docs: DocTable, fraction: float, seed: int) -> None:
    """Choose round(n * fraction) validation documents at random (seeded); at least one when
    fraction > 0 and there are two documents or more, and never all of them."""
    n = len(docs)
    n_val = round(n * fraction)
    if fraction > 0 and n >= 2:
        n_val = min(max(n_val, 1), n - 1)
    else:
        n_val = min(n_val, max(n - 1, 0))
    docs.val = np.zeros(n, dtype=bool)
    docs.val[np.random.default_rng(seed).choice(n, size=n_val, replace=False)] = True
    docs.tokens = np.zeros(n, dtype=np.int64)


def _training_texts(docs: DocTable, tmp: Path, opts: PrepareOptions) -> Iterator[str]:
    """The train documents the tokenizer learns from: all of them, or when they exceed
    --tokenizer-sample-mb, each kept with probability sample / total (seeded); large ones in
    pieces. The char tokenizer reads every document, validation ones included: its vocabulary
    is the set of characters, so a character seen only in a validation document (or only in
    documents the sample left out) would otherwise become <|unk|> (docs/tokenizers.md)."""
    if opts.tokenizer == "char":
        chosen = np.arange(len(docs))
    else:
        chosen = np.flatnonzero(~docs.val)
    total = docs.total_bytes(chosen)
    cap = opts.tokenizer_sample_mb * 1e6
    if cap and total > cap and opts.tokenizer != "char":
        keep = np.random.default_rng(opts.seed + 1).random(len(chosen)) < cap / total
        chosen = chosen[keep] if keep.any() else chosen[:1]
    for i in chosen:
        store, offset, nbytes = docs.where(int(i), tmp)
        for off, n in document_pieces(store, offset, nbytes, tokenizing.TASK_BYTES):
            yield read_document(store, off, n)


def _tokenizer(docs: DocTable, tmp: Path, opts: PrepareOptions) -> Tokenizer:
    if opts.tokenizer not in KINDS:
        tok = load(opts.tokenizer)
    else:
        options = {"special_tokens": [EOS]} if opts.tokenizer == "digits" else {}
        tok = train_tokenizer(opts.tokenizer, _training_texts(docs, tmp, opts),
                              vocab_size=opts.vocab_size, **options)
    if tok.eos_id is None:
        raise UserError(f"the {tok.kind} tokenizer has no {EOS} token to put between "
                        "documents")
    return tok


def _tokenize(docs: DocTable, tmp: Path, tok: Tokenizer, opts: PrepareOptions,
              summary: Summary) -> str:
    dtype = token_dtype_name(tok.vocab_size)
    total = docs.total_bytes()
    with _bar(opts, total, "tokenize") as bar:
        for split, file in ((False, TRAIN_FILE), (True, VAL_FILE)):
            writer = TokenWriter(tmp / file, dtype)
            chosen = (docs.where(int(i), tmp) + (int(i),)
                      for i in np.flatnonzero(docs.val == split))
            tasks = tokenizing.plan_tasks(chosen)
            results = imap_ordered(tokenizing.encode_task, tasks, opts.workers,
                                   tokenizing.init_worker, (tok.to_json(), dtype))
            for data, counts, unknown, nbytes in results:
                writer.write_bytes(data)
                for doc, count in counts:
                    docs.tokens[doc] += count
                summary.unknown_tokens += unknown
                bar.update(nbytes)
            writer.close()
            if split:
                summary.val_tokens, summary.val_documents = writer.tokens, int(docs.val.sum())
            else:
                summary.train_tokens = writer.tokens
                summary.train_documents = len(docs) - int(docs.val.sum())
    for file_type, tokens in docs.tokens_by_type().items():
        summary.add_tokens(file_type, tokens)
    return dtype


def _files_with_tokens(spool_path: Path, docs: DocTable) -> Iterator[dict]:
    with open(spool_path, encoding="utf-8") as f:
        for line in f:
            entry = json.loads(line)
            kept = entry.pop("_docs", None)
            if kept is not None:
                entry["tokens"] = int(docs.tokens[kept[0]:kept[1]].sum())
            yield entry


def prepare(opts: PrepareOptions, log: Callable[[str], None] | None = None) -> PrepareResult:
    """Run the whole preparation; `log` receives the summary table and notes.

    Raises UserError (one line) on bad options, a missing input, an existing output without
    --overwrite, or when no file gave usable text.
    """
    opts.check()
    out = Path(opts.out)
    outdir.check_target(out, opts.overwrite)
    for given in opts.inputs:
        if not os.path.lexists(given):
            raise UserError(f"input not found: {printable(str(given))}")
    outdir.remove_stale(out)
    tmp = outdir.make_temp(out)
    summary = Summary()
    try:
        spool_path = tmp / SPOOL
        with open(spool_path, "w", encoding="utf-8") as spool:
            clock = time.perf_counter()
            docs = _extract(opts, tmp, summary, spool)
        summary.seconds["extract"] = round(time.perf_counter() - clock, 3)
        summary.documents = len(docs)
        if not len(docs):
            if log:
                log(summary.table())
            raise UserError(summary.nothing_usable(
                ", ".join(printable(str(p)) for p in opts.inputs)))
        _split(docs, opts.val_fraction, opts.seed)
        clock = time.perf_counter()
        tok = _tokenizer(docs, tmp, opts)
        summary.seconds["tokenizer"] = round(time.perf_counter() - clock, 3)
        clock = time.perf_counter()
        tok.save(tmp / TOKENIZER_FILE)
        dtype = _tokenize(docs, tmp, tok, opts, summary)
        summary.seconds["tokenize"] = round(time.perf_counter() - clock, 3)
        header = {"format": FORMAT, "version": VERSION, "dtype": dtype,
                  "vocab_size": tok.vocab_size, "tokenizer_kind": tok.kind,
                  "eos_id": tok.eos_id, "train_tokens": summary.train_tokens,
                  "val_tokens": summary.val_tokens, "val_fraction": opts.val_fraction,
                  "seed": opts.seed, "inputs": [printable(str(p)) for p in opts.inputs]}
        write_meta(tmp / META_FILE, header, _files_with_tokens(spool_path, docs),
                   summary.to_dict())
        # Every worker's store, also the empty one of a worker that got no file (or whose
        # files were all skipped): docs.stores names only those holding documents.
        for scratch in [spool_path, *tmp.glob(f"{extract.STORE_PREFIX}*")]:
            scratch.unlink(missing_ok=True)
        outdir.publish(tmp, out, opts.overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if log:
        log(summary.table())
        log(f"\nwrote {printable(str(out))}: train {plural(summary.train_tokens, 'token')} "
            f"({plural(summary.train_documents, 'document')}), val "
            f"{plural(summary.val_tokens, 'token')} "
            f"({plural(summary.val_documents, 'document')}); {tok.kind} tokenizer, vocabulary "
            f"{tok.vocab_size:,}, {dtype}; "
            + ", ".join(f"{stage} {sec:.1f} s" for stage, sec in summary.seconds.items()))
    return PrepareResult(out=out, summary=summary, tokenizer=tok)
