"""Hugging Face `tokenizers`: export a sheepop BPE tokenizer to its tokenizer.json format.

The exported file reproduces sheepop's encoding step by step: special tokens are "added tokens"
matched whole; the pre-tokenizer is a `Split` on sheepop's own pattern followed by `ByteLevel`
(which only maps bytes to printable characters, `use_regex=false`); the model is BPE with the
same vocabulary (byte-level names) and the same merges in the same rank order; the decoder is
`ByteLevel`. `tokenizers.Tokenizer.from_file(path)` then gives the very same ids. (Training
through Hugging Face's trainer is bpe_train_hf.py; importing a Hugging Face directory's
tokenizer is sheepop.interop.hf.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sheepop.errors import UserError
from sheepop.files import atomic_write_text
from sheepop.tokenizers.base import Tokenizer
from sheepop.tokenizers.bpe import BPETokenizer
from sheepop.tokenizers.pretokenize import token_to_str


def to_hf_dict(tok: Tokenizer) -> dict[str, Any]:
    """The Hugging Face tokenizer.json content for a byte-level BPE tokenizer."""
    if not isinstance(tok, BPETokenizer):
        raise UserError(f"only bpe tokenizers can be exported to Hugging Face format "
                        f"(this one is {tok.kind})")
    vocab = {token_to_str(t): i for i, t in enumerate(tok.tokens) if t is not None}
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                  "use_regex": False}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True}
            for t, i in sorted(tok.special_tokens.items(), key=lambda kv: kv[1])],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": tok.pattern}, "behavior": "Isolated",
             "invert": False},
            byte_level]},
        "post_processor": None,
        "decoder": byte_level,
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None,
            "continuing_subword_prefix": None, "end_of_word_suffix": None,
            "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
            "vocab": vocab,
            "merges": [[token_to_str(tok.tokens[a]), token_to_str(tok.tokens[b])]  # type: ignore
                       for a, b in tok.merges],
        },
    }


def export_hf(tok: Tokenizer, path: str | Path) -> None:
    """Write `tok` as a Hugging Face tokenizer.json (atomically)."""
    atomic_write_text(path, json.dumps(to_hf_dict(tok), ensure_ascii=False, indent=1) + "\n")
