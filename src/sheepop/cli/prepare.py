"""`sheepop prepare INPUT... --out DATA_DIR`: files -> token shards `sheepop train` reads."""

from __future__ import annotations

import argparse
import os

from sheepop.cli.common import HelpFormatter
from sheepop.tokenizers import KINDS


def _default_workers() -> int:
    return max(1, min(4, os.cpu_count() or 1))


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "prepare", help="turn files (text, code, HTML, PDF, images, JSON Lines, Parquet) "
                           "into training data",
        description="Read INPUT files and folders (text and Markdown in any common encoding, "
                    "HTML, source code, PDF, images by OCR; JSON Lines (.jsonl, .jsonl.gz, "
                    ".jsonl.zst) and Parquet with one document per line or row), normalise and "
                    "deduplicate the documents, train or load a tokenizer and write DATA_DIR "
                    "(train.bin, val.bin, tokenizer.json, meta.json) for `sheepop train DATA_DIR`. "
                    "Prints what was used and what was skipped, and why. Exit status 2 only "
                    "when nothing usable was found.",
        formatter_class=HelpFormatter)
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="files and folders to read")
    p.add_argument("--out", required=True, metavar="DATA_DIR", help="directory to write")
    p.add_argument("--tokenizer", default="char", metavar="|".join(KINDS) + "|FILE",
                   help="tokenizer kind to train on the train split (char: on every document, "
                        "so validation has no unknown character), or a tokenizer.json to use")
    p.add_argument("--vocab-size", type=int, default=0,
                   help="vocabulary size (0: the kind's default)")
    p.add_argument("--include", action="append", default=[], metavar="GLOB",
                   help="only read files matching GLOB (repeatable; relative to the folder)")
    p.add_argument("--exclude", action="append", default=[], metavar="GLOB",
                   help="skip files and folders matching GLOB (repeatable)")
    p.add_argument("--hidden", action="store_true",
                   help="also read hidden files and folders (names starting with '.')")
    p.add_argument("--follow-links", action="store_true",
                   help="also read what symbolic links leading outside the inputs point to "
                        "(by default they are skipped and listed); the report names each such "
                        "file's real path")
    p.add_argument("--workers", type=int, default=_default_workers(),
                   help="worker processes for extraction and tokenization")
    p.add_argument("--ocr-lang", default="eng", metavar="LANG",
                   help="Tesseract language(s) for images, e.g. eng or eng+fra")
    p.add_argument("--text-field", default="text", metavar="FIELD",
                   help="JSON Lines / Parquet: the key or column holding each document's text; "
                        "a dotted path (meta.body) for a nested field")
    p.add_argument("--val-fraction", type=float, default=0.1,
                   help="fraction of documents held out for validation")
    p.add_argument("--seed", type=int, default=1337, help="seed of the train/val split")
    p.add_argument("--tokenizer-sample-mb", type=float, default=256.0, metavar="MB",
                   help="train the tokenizer on at most this many MB of train documents, "
                        "drawn at random (0: all; char always reads all)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace DATA_DIR if it exists (only a directory prepare made)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sheepop.data.ingest import PrepareOptions, prepare

    opts = PrepareOptions(
        inputs=list(args.inputs), out=args.out, tokenizer=args.tokenizer,
        vocab_size=args.vocab_size, include=list(args.include), exclude=list(args.exclude),
        hidden=args.hidden, follow_links=args.follow_links, workers=args.workers,
        ocr_lang=args.ocr_lang, text_field=args.text_field,
        val_fraction=args.val_fraction, seed=args.seed, overwrite=args.overwrite,
        tokenizer_sample_mb=args.tokenizer_sample_mb,
        progress=False if args.no_progress else None)
    from sheepop.cli.writing import writing
    with writing(args.out, "the prepared data"):
        prepare(opts, log=lambda line: print(line, flush=True))
    return 0
