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

from sheepop.checkpoint import atomic_write_text
from sheepop.errors import UserError
from sheepop.tokenizers.bpe import BPETokenizer
from sheepop.tokenizers.pretokenize import PATTERNS, str_to_token, token_to_str

GPT2_SPECIALS = ("<|endoftext|>",)


def _read_text(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{what} not found: {path}") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: {what} is not UTF-8 text") from None
    except OSError as e:
        raise UserError(f"cannot read {what} {path}: {e.strerror}") from None


def read_vocab(path: str | Path) -> dict[str, int]:
    path = Path(path)
    try:
        vocab = json.loads(_read_text(path, "vocab.json"))
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: vocab.json is not valid JSON ({e})") from None
    if not isinstance(vocab, dict) or not all(
            isinstance(k, str) and type(v) is int for k, v in vocab.items()):
        raise UserError(f"{path}: vocab.json must map token strings to integer ids")
    if sorted(vocab.values()) != list(range(len(vocab))):
        raise UserError(f"{path}: vocab.json ids must be exactly 0..{len(vocab) - 1}, each once")
    return vocab


def read_merges(path: str | Path) -> list[tuple[str, str]]:
    path = Path(path)
    merges = []
    for n, line in enumerate(_read_text(path, "merges.txt").splitlines(), start=1):
        if (n == 1 and line.startswith("#version")) or not line.strip():
            continue
        parts = line.split(" ")
        if len(parts) != 2 or not all(parts):
            raise UserError(f"{path}:{n}: a merge line must be two tokens separated by one "
                            f"space, got {line!r}")
        merges.append((parts[0], parts[1]))
    return merges


def import_gpt2(vocab_path: str | Path, merges_path: str | Path,
                special_tokens: Sequence[str] | None = None,
                pattern: str = "gpt2-exact") -> BPETokenizer:
    """A sheepop BPE tokenizer from GPT-2-format files, with GPT-2's ids.

    `special_tokens`: names in vocab.json to treat as special (default: <|endoftext|> when
    present). Any other name that is not a byte-level token is an error."""
    vocab = read_vocab(vocab_path)
    pairs = read_merges(merges_path)
    if special_tokens is None:
        special_tokens = [t for t in GPT2_SPECIALS if t in vocab]
    missing = [t for t in special_tokens if t not in vocab]
    if missing:
        raise UserError(f"{vocab_path}: special token {missing[0]!r} is not in vocab.json")
    specials = {t: vocab[t] for t in special_tokens}
    tokens: list[bytes | None] = [None] * len(vocab)
    for name, i in vocab.items():
        if name in specials:
            continue
        data = str_to_token(name)
        if data is None:
            raise UserError(f"{vocab_path}: token {name!r} (id {i}) is not a byte-level token; "
                            "name it with --special if it is a special token")
        tokens[i] = data
    ids = {t: i for i, t in enumerate(tokens) if t is not None}
    if len(ids) != len(vocab) - len(specials):
        raise UserError(f"{vocab_path}: two tokens have the same bytes")
    absent = [b for b in range(256) if bytes([b]) not in ids]
    if absent:
        raise UserError(f"{vocab_path}: the single-byte token for byte {absent[0]} is missing "
                        "(a byte-level vocabulary needs all 256)")
    merges = []
    for n, (left, right) in enumerate(pairs, start=1):
        a, b = ids.get(str_to_token(left) or b""), ids.get(str_to_token(right) or b"")
        if a is None or b is None or tokens[a] + tokens[b] not in ids:  # type: ignore
            raise UserError(f"{merges_path}: merge {n} ({left} {right}) does not join two "
                            "tokens of vocab.json into a token of vocab.json")
        merges.append((a, b))
    return BPETokenizer(tokens, merges, specials, PATTERNS.get(pattern, pattern))


def export_gpt2(tok: BPETokenizer, vocab_path: str | Path, merges_path: str | Path) -> None:
    """Write `tok` as vocab.json + merges.txt (special tokens included in vocab.json)."""
    if not isinstance(tok, BPETokenizer):
        raise UserError(f"only bpe tokenizers have GPT-2 files (this one is {tok.kind})")
    vocab = {tok.id_to_token(i): i for i in range(tok.vocab_size)}
    atomic_write_text(vocab_path, json.dumps(vocab, ensure_ascii=False))
    lines = [f"{token_to_str(tok.tokens[a])} {token_to_str(tok.tokens[b])}"  # type: ignore
             for a, b in tok.merges]
    atomic_write_text(merges_path, "#version: 0.2\n" + "\n".join(lines) + "\n")
