"""GPT-2's tokenizer files: `vocab.json` (byte-level token name -> id) and `merges.txt`
("#version" line, then one "left right" merge per line, in rank order).

Importing keeps GPT-2's ids exactly (so the result can drive GPT-2 weights) and uses OpenAI's
unchanged pre-split pattern (`gpt2-exact`), so text encodes to the same ids as GPT-2's own
tokenizer. `<|endoftext|>` becomes a special token, matched whole.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sheepop.errors import UserError
from sheepop.files import atomic_write_text, read_json, read_text
from sheepop.tokenizers.bpe import BPETokenizer
from sheepop.tokenizers.pretokenize import PATTERNS, str_to_token, token_to_str

GPT2_SPECIALS = ("<|endoftext|>",)


def check_vocab(vocab: Any, where: str) -> dict[str, int]:
    """`vocab` (parsed vocab.json) if it maps token names to the ids 0..n-1, each once."""
    if not isinstance(vocab, dict) or not all(
            isinstance(k, str) and type(v) is int for k, v in vocab.items()):
        raise UserError(f"{where}: vocab.json must map token strings to integer ids")
    if sorted(vocab.values()) != list(range(len(vocab))):
        raise UserError(f"{where}: vocab.json ids must be exactly 0..{len(vocab) - 1}, each once")
    return vocab


def parse_merges(text: str, where: str) -> list[tuple[str, str]]:
    """The (left, right) pairs of merges.txt's text, in rank order."""
    merges = []
    for n, line in enumerate(text.splitlines(), start=1):
        if (n == 1 and line.startswith("#version")) or not line.strip():
            continue
        parts = line.split(" ")
        if len(parts) != 2 or not all(parts):
            raise UserError(f"{where}:{n}: a merge line must be two tokens separated by one "
                            f"space, got {line!r}")
        merges.append((parts[0], parts[1]))
    return merges


def import_gpt2(vocab_path: str | Path, merges_path: str | Path,
                special_tokens: Sequence[str] | None = None,
                pattern: str = "gpt2-exact") -> BPETokenizer:
    """A sheepop BPE tokenizer from GPT-2-format files, with GPT-2's ids (see `from_gpt2`)."""
    vocab = check_vocab(read_json(vocab_path, what="vocab.json"), str(vocab_path))
    pairs = parse_merges(read_text(merges_path, what="merges.txt"), str(merges_path))
    return from_gpt2(vocab, pairs, special_tokens, pattern, str(vocab_path), str(merges_path))


def from_gpt2(vocab: dict[str, int], pairs: Sequence[tuple[str, str]],
              special_tokens: Sequence[str] | None = None, pattern: str = "gpt2-exact",
              vocab_where: str = "vocab.json", merges_where: str = "merges.txt"
              ) -> BPETokenizer:
    """A sheepop BPE tokenizer from GPT-2's vocabulary and merges, with GPT-2's ids.

    `special_tokens`: names in the vocabulary to treat as special (default: <|endoftext|> when
    present). Any other name that is not a byte-level token is an error."""
    if special_tokens is None:
        special_tokens = [t for t in GPT2_SPECIALS if t in vocab]
    missing = [t for t in special_tokens if t not in vocab]
    if missing:
        raise UserError(f"{vocab_where}: special token {missing[0]!r} is not in vocab.json")
    specials = {t: vocab[t] for t in special_tokens}
    tokens, ids = _gpt2_tokens(vocab, specials, vocab_where)
    merges = _gpt2_merges(pairs, tokens, ids, merges_where)
    return BPETokenizer(tokens, merges, specials, PATTERNS.get(pattern, pattern))


def _gpt2_tokens(vocab: dict[str, int], specials: dict[str, int], vocab_where: str
                 ) -> tuple[list[bytes | None], dict[bytes, int]]:
    """vocab.json's tokens as bytes by id (None at a special token's) and the id of each: every
    other name a byte-level token, none twice, the 256 single bytes all there."""
    tokens: list[bytes | None] = [None] * len(vocab)
    for name, i in vocab.items():
        if name in specials:
            continue
        data = str_to_token(name)
        if data is None:
            raise UserError(f"{vocab_where}: token {name!r} (id {i}) is not a byte-level "
                            "token; name it with --special if it is a special token")
        tokens[i] = data
    ids = {t: i for i, t in enumerate(tokens) if t is not None}
    if len(ids) != len(vocab) - len(specials):
        raise UserError(f"{vocab_where}: two tokens have the same bytes")
    absent = [b for b in range(256) if bytes([b]) not in ids]
    if absent:
        raise UserError(f"{vocab_where}: the single-byte token for byte {absent[0]} is missing "
                        "(a byte-level vocabulary needs all 256)")
    return tokens, ids


def _gpt2_merges(pairs: Sequence[tuple[str, str]], tokens: list[bytes | None],
                 ids: dict[bytes, int], merges_where: str) -> list[tuple[int, int]]:
    """merges.txt's pairs as id pairs, each joining two tokens into a token of vocab.json."""
    merges = []
    for n, (left, right) in enumerate(pairs, start=1):
        a, b = ids.get(str_to_token(left) or b""), ids.get(str_to_token(right) or b"")
        if a is None or b is None or tokens[a] + tokens[b] not in ids:  # type: ignore
            raise UserError(f"{merges_where}: merge {n} ({left} {right}) does not join two "
                            "tokens of vocab.json into a token of vocab.json")
        merges.append((a, b))
    return merges


def export_gpt2(tok: BPETokenizer, vocab_path: str | Path, merges_path: str | Path) -> None:
    """Write `tok` as vocab.json + merges.txt (special tokens included in vocab.json)."""
    if not isinstance(tok, BPETokenizer):
        raise UserError(f"only bpe tokenizers have GPT-2 files (this one is {tok.kind})")
    vocab = {tok.id_to_token(i): i for i in range(tok.vocab_size)}
    atomic_write_text(vocab_path, json.dumps(vocab, ensure_ascii=False))
    lines = [f"{token_to_str(tok.tokens[a])} {token_to_str(tok.tokens[b])}"  # type: ignore
             for a, b in tok.merges]
    atomic_write_text(merges_path, "#version: 0.2\n" + "\n".join(lines) + "\n")
