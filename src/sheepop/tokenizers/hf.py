"""Hugging Face `tokenizers`: export a sheepop tokenizer to its tokenizer.json format.

The exported file reproduces sheepop's encoding step by step, so
`tokenizers.Tokenizer.from_file(path)` gives the very same ids. In every kind the special tokens
are "added tokens", matched whole before anything else, as sheepop's `split_specials` does.

- bpe: the pre-tokenizer is a `Split` on sheepop's own pattern followed by `ByteLevel` (which
  only maps bytes to printable characters, `use_regex=false`); the model is BPE with the same
  vocabulary (byte-level names) and the same merges in the same rank order; the decoder is
  `ByteLevel`.
- char: no pre-tokenizer, so the text is one "word" that BPE cuts into characters (code points);
  the vocabulary is the characters, there are no merges, and a character outside it is
  `<|unk|>`, one per character (`fuse_unk` off). The `Fuse` decoder concatenates: decoding is
  exact, as sheepop's.
- word: the pre-tokenizer drops whitespace other than line breaks, then isolates sheepop's word
  pattern (words, single punctuation marks, "\n"); the model is `WordLevel` with `<|unk|>`
  (and a `Lowercase` normalizer for a lowercasing vocabulary). Decoding joins words with spaces
  and takes them out before punctuation (the `WordPiece` decoder's clean-up), close to
  sheepop's own spacing rule but not the same in every case (e.g. around brackets).

(Training through Hugging Face's trainer is bpe_train_hf.py; importing a Hugging Face
directory's tokenizer is sheepop.interop.hf.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sheepop.errors import UserError
from sheepop.files import atomic_write_text
from sheepop.tokenizers.base import Tokenizer
from sheepop.tokenizers.bpe import BPETokenizer
from sheepop.tokenizers.char import CharTokenizer
from sheepop.tokenizers.pretokenize import token_to_str
from sheepop.tokenizers.word import WORD_PATTERN, WordTokenizer

EXPORTED_KINDS = ("bpe", "char", "word")


def to_hf_dict(tok: Tokenizer) -> dict[str, Any]:
    """The Hugging Face tokenizer.json content for a bpe, char or word tokenizer."""
    if isinstance(tok, BPETokenizer):
        parts = _bpe_parts(tok)
    elif isinstance(tok, CharTokenizer):
        parts = _char_parts(tok)
    elif isinstance(tok, WordTokenizer):
        parts = _word_parts(tok)
    else:
        raise UserError(f"a {tok.kind} tokenizer has no Hugging Face form (these do: "
                        f"{', '.join(EXPORTED_KINDS)})")
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True}
            for t, i in sorted(tok.special_tokens.items(), key=lambda kv: kv[1])],
        "normalizer": None,
        "pre_tokenizer": None,
        "post_processor": None,
        **parts,
    }


def _bpe_model(vocab: dict[str, int], merges: list[list[str]], unk: str | None
               ) -> dict[str, Any]:
    return {"type": "BPE", "dropout": None, "unk_token": unk, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
            "ignore_merges": False, "vocab": vocab, "merges": merges}


def _bpe_parts(tok: BPETokenizer) -> dict[str, Any]:
    vocab = {token_to_str(t): i for i, t in enumerate(tok.tokens) if t is not None}
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                  "use_regex": False}
    merges = [[token_to_str(tok.tokens[a]), token_to_str(tok.tokens[b])]  # type: ignore
              for a, b in tok.merges]
    return {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": tok.pattern}, "behavior": "Isolated",
                 "invert": False},
                byte_level]},
            "decoder": byte_level, "model": _bpe_model(vocab, merges, None)}


def _char_parts(tok: CharTokenizer) -> dict[str, Any]:
    vocab = {**tok.special_tokens, **{c: tok.token_to_id(c) for c in tok.chars}}
    return {"decoder": {"type": "Fuse"}, "model": _bpe_model(vocab, [], tok.id_to_token(
        tok.unk_id) if tok.unk_id is not None else None)}


def _word_parts(tok: WordTokenizer) -> dict[str, Any]:
    vocab = {**tok.special_tokens, **{w: tok.token_to_id(w) for w in tok.words}}
    return {
        "normalizer": {"type": "Lowercase"} if tok.lowercase else None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": r"[^\S\n]+"}, "behavior": "Removed",
             "invert": False},
            {"type": "Split", "pattern": {"Regex": WORD_PATTERN}, "behavior": "Isolated",
             "invert": False}]},
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
        "model": {"type": "WordLevel", "vocab": vocab,
                  "unk_token": tok.id_to_token(tok.unk_id) if tok.unk_id is not None else None},
    }


def export_hf(tok: Tokenizer, path: str | Path) -> None:
    """Write `tok` as a Hugging Face tokenizer.json (atomically)."""
    atomic_write_text(path, json.dumps(to_hf_dict(tok), ensure_ascii=False, indent=1) + "\n")
