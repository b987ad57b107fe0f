"""Character tokenizer: one id per Unicode character (code point).

Ids 0..3 are the special tokens <|bos|> <|eos|> <|pad|> <|unk|>; then come the corpus's distinct
characters in code-point order (or, when a vocabulary size is given, only its most frequent
characters, ties broken by code point, still stored in code-point order). A character the
vocabulary lacks encodes to <|unk|>. Decoding is the exact inverse for known characters.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from sheepop.errors import UserError
from sheepop.tokenizers.base import DEFAULT_SPECIALS, Tokenizer
from sheepop.tokenizers.file_checks import bad_file, leading_and_added, read_specials


class CharTokenizer(Tokenizer):
    kind = "char"

    def __init__(self, chars: Sequence[str], special_tokens: Sequence[str] = DEFAULT_SPECIALS,
                 added_specials: Sequence[str] = ()):
        """`special_tokens` take ids 0.., the characters the next ones, `added_specials`
        (added to a trained tokenizer: Tokenizer.with_special_tokens) those after them."""
        offset = len(special_tokens)
        super().__init__({**{t: i for i, t in enumerate(special_tokens)},
                          **{t: offset + len(chars) + k for k, t in enumerate(added_specials)}})
        self.chars: list[str] = list(chars)
        self._stoi: dict[str, int] = {c: offset + i for i, c in enumerate(self.chars)}
        self._itos: dict[int, str] = {i: c for c, i in self._stoi.items()}
        self._unk = self.unk_id

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int = 0) -> CharTokenizer:
        counts: Counter[str] = Counter()
        for text in texts:
            counts.update(text)
        if not counts:
            raise UserError("cannot train a char tokenizer on an empty corpus")
        n_special = len(DEFAULT_SPECIALS)
        if vocab_size:
            if vocab_size <= n_special:
                raise UserError(f"char vocab_size {vocab_size} leaves no room for characters "
                                f"after the {n_special} special tokens")
            keep = sorted(counts, key=lambda c: (-counts[c], c))[:vocab_size - n_special]
        else:
            keep = list(counts)
        return cls(sorted(keep))

    @property
    def vocab_size(self) -> int:
        return len(self.special_tokens) + len(self.chars)

    def _encode_ordinary(self, text: str) -> list[int]:
        stoi, unk = self._stoi, self._unk
        if unk is None:
            missing = next((c for c in text if c not in stoi), None)
            if missing is not None:
                raise UserError(f"character {missing!r} is not in this char tokenizer's "
                                "vocabulary")
        return [stoi.get(c, unk) for c in text]  # type: ignore[misc]

    def _knows(self, char: str) -> bool:
        return char in self._stoi

    def _piece_bytes(self, i: int, prev: int | None) -> bytes:
        return self._itos[i].encode("utf-8", "surrogatepass")

    def _token_str(self, i: int) -> str:
        return self._itos[i]

    def _str_to_id(self, token: str) -> int | None:
        return self._stoi.get(token)

    def _payload(self) -> dict[str, Any]:
        return {"chars": self.chars}

    @classmethod
    def _from_payload(cls, data: dict[str, Any], where: str) -> CharTokenizer:
        specials = read_specials(data, where)
        chars = data.get("chars")
        if not isinstance(chars, list) or not all(isinstance(c, str) and len(c) == 1
                                                  for c in chars):
            raise bad_file(where, "'chars' must be a list of single characters")
        if len(set(chars)) != len(chars):
            raise bad_file(where, "'chars' lists a character twice")
        lead, added = leading_and_added(specials, len(chars), where)
        return cls(chars, special_tokens=lead, added_specials=added)
