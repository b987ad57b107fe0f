"""Hugging Face `tokenizers`: export a sheepop BPE tokenizer to its JSON format, and train
merges through it (the optional `--backend hf`).

The exported file reproduces sheepop's encoding step by step: special tokens are "added tokens"
matched whole; the pre-tokenizer is a `Split` on sheepop's own pattern followed by `ByteLevel`
(which only maps bytes to printable characters, `use_regex=false`); the model is BPE with the
same vocabulary (byte-level names) and the same merges in the same rank order; the decoder is
`ByteLevel`. `tokenizers.Tokenizer.from_file(path)` then gives the very same ids.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from sheepop.checkpoint import atomic_write_text
from sheepop.errors import UserError
from sheepop.tokenizers.base import SpecialMatcher, Tokenizer
from sheepop.tokenizers.pretokenize import str_to_token, token_to_str


def to_hf_dict(tok: Tokenizer) -> dict[str, Any]:
    """The Hugging Face tokenizer.json content for a byte-level BPE tokenizer."""
    from sheepop.tokenizers.bpe import BPETokenizer
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


def _ordinary_pieces(texts: Iterable[str], special_tokens: Sequence[str]) -> Iterator[str]:
    """The corpus with special tokens cut out, as sheepop's own trainer sees it."""
    matcher = SpecialMatcher({t: k for k, t in enumerate(special_tokens)})
    for text in texts:
        for piece, special in matcher.split(text):
            if special is None:
                yield piece


def train_merges_hf(texts: Iterable[str], n_tokens: int, pattern: str,
                    special_tokens: Sequence[str], progress: bool = False
                    ) -> list[tuple[bytes, bytes]]:
    """Merges (as byte pairs, in rank order) learned by Hugging Face's BPE trainer on the
    same pre-split, up to `n_tokens` tokens (256 bytes included). Its tie-break differs from
    sheepop's, so the merges can differ where two pairs have the same count."""
    try:
        from tokenizers import Regex, models, pre_tokenizers, trainers
        from tokenizers import Tokenizer as HFTokenizer
    except ImportError:
        raise UserError("--backend hf needs the `tokenizers` package "
                        "(pip install tokenizers)") from None
    hf = HFTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    trainer = trainers.BpeTrainer(vocab_size=n_tokens, show_progress=progress,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    pieces = _ordinary_pieces(texts, special_tokens)
    first = next(pieces, None)
    if first is None:
        raise UserError("cannot train a bpe tokenizer on an empty corpus")
    hf.train_from_iterator(_chain(first, pieces), trainer=trainer)
    merges = json.loads(hf.to_str())["model"]["merges"]
    out = []
    for m in merges:
        left, right = m.split(" ") if isinstance(m, str) else m
        out.append((str_to_token(left), str_to_token(right)))
    return out  # type: ignore[return-value]


def _chain(first: str, rest: Iterator[str]) -> Iterator[str]:
    yield first
    yield from rest
