"""Tokenizers: char, word, byte-level BPE and digits behind one interface (see base.py), and a
pretrained model's own tokenizer read from its tokenizer.json or GGUF file (pretrained/).

    tok = train_tokenizer("bpe", texts, vocab_size=4096)
    tok.save("tok.json"); tok = load("tok.json")      # whichever kind the file holds
    ids = tok.encode("hello", add_eos=True); text = tok.decode(ids)

Default vocabulary sizes (vocab_size=0): char and word keep every character / word of the
corpus, bpe learns up to DEFAULT_BPE_VOCAB ids, digits always has 11 (+ specials asked for).
Vocabulary sizes always count the special tokens.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sheepop.config.schema import TOKENIZER_KINDS
from sheepop.errors import UserError
from sheepop.files import MAX_JSON_BYTES, parse_document, read_text, shown
from sheepop.tokenizers.base import (
    BOS,
    EOS,
    PAD,
    TOKENIZER_FILE,
    UNK,
    Tokenizer,
)
from sheepop.tokenizers.streaming import IncrementalDecoder, decode_stream

KINDS = TOKENIZER_KINDS  # the one list of tokenizer kinds (sheepop.config.schema)
DEFAULT_BPE_VOCAB = 4096

# Kinds are imported when first used, so that loading a char tokenizer never pays for bpe.
_CLASSES = {
    "char": ("sheepop.tokenizers.char", "CharTokenizer"),
    "word": ("sheepop.tokenizers.word", "WordTokenizer"),
    "bpe": ("sheepop.tokenizers.bpe", "BPETokenizer"),
    "digits": ("sheepop.tokenizers.digits", "DigitsTokenizer"),
    "pretrained": ("sheepop.tokenizers.pretrained.tokenizer", "PretrainedTokenizer"),
}

__all__ = ["BOS", "EOS", "PAD", "UNK", "KINDS", "DEFAULT_BPE_VOCAB", "Tokenizer",
           "IncrementalDecoder", "decode_stream", "load", "loads", "train_tokenizer",
           "tokenizer_class"]


def tokenizer_class(kind: str) -> type[Tokenizer]:
    if kind not in _CLASSES:
        raise UserError(f"unknown tokenizer kind {kind!r} (choose from {', '.join(KINDS)})")
    module, name = _CLASSES[kind]
    return getattr(importlib.import_module(module), name)


def train_tokenizer(kind: str, texts: Iterable[str], vocab_size: int = 0,
                    **options: Any) -> Tokenizer:
    """Learn a tokenizer of `kind` from `texts` (an iterable of documents, read once).

    Options by kind: word: min_freq, lowercase; bpe: pattern ("gpt2" | "gpt4" | a regex),
    special_tokens, backend ("sheepop" | "hf"), workers, progress; digits: special_tokens.
    """
    cls = tokenizer_class(kind)
    if not isinstance(vocab_size, int) or vocab_size < 0:
        raise UserError(f"vocab_size must be a non-negative integer, got {vocab_size!r}")
    if kind == "bpe" and not vocab_size:
        vocab_size = DEFAULT_BPE_VOCAB
    try:
        return cls.train(texts, vocab_size=vocab_size, **options)  # type: ignore[attr-defined]
    except TypeError as e:
        if "unexpected keyword argument" in str(e):
            raise UserError(f"{kind} tokenizer: {e}") from None
        raise


def loads(json_text: str | bytes, where: str = "tokenizer") -> Tokenizer:
    """A tokenizer from the text of its JSON file; `where` names it in error messages."""
    data = parse_document(json_text, TOKENIZER_FILE, where, hint=_foreign_hint)
    kind = data.get("kind")
    if not isinstance(kind, str) or kind not in _CLASSES:  # a list or dict is not hashable
        raise UserError(f"{where}: unknown tokenizer kind {shown(kind)} "
                        f"(this sheepop knows {', '.join(KINDS)})")
    _check_unicode(data, where)
    return tokenizer_class(kind).from_document(data, where)


def _check_unicode(data: Any, where: str) -> None:
    """Every string of the file is Unicode text: JSON can spell a lone surrogate ("\\ud800"),
    which no text holds and which fails only later, when decoded text is printed."""
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise UserError(f"{where}: not a valid sheepop tokenizer file (it holds the "
                                f"lone surrogate {shown(item)}, which is not text)") from None


def _foreign_hint(data: Any) -> str:
    if isinstance(data, dict) and "model" in data and "added_tokens" in data:
        return ("; it looks like a Hugging Face tokenizer.json, which sheepop exports but "
                "does not load (use `sheepop tokenizer import --gpt2` for GPT-2 files)")
    return ""


def load(path: str | Path) -> Tokenizer:
    """The tokenizer saved at `path`, of whichever kind the file holds."""
    return loads(read_text(path, what="tokenizer file", limit=MAX_JSON_BYTES), where=str(path))
