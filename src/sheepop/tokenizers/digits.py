"""Digits tokenizer: exactly eleven ids, '0'..'9' are ids 0..9 and ' ' is id 10.

Made for the arithmetic-progression task, whose text is numbers separated by spaces. Special
tokens exist only when asked for (`special_tokens=["<|eos|>", ...]`), with ids 11, 12, ... in the
order given. Any other character is an error, unless <|unk|> was asked for.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sheepop.errors import UserError
from sheepop.tokenizers.base import Tokenizer
from sheepop.tokenizers.file_checks import bad_file, check_ids_dense, read_specials

ALPHABET = "0123456789 "
_STOI = {c: i for i, c in enumerate(ALPHABET)}
_BYTES = [c.encode("ascii") for c in ALPHABET]


class DigitsTokenizer(Tokenizer):
    kind = "digits"

    def __init__(self, special_tokens: Sequence[str] = ()) -> None:
        if len(set(special_tokens)) != len(special_tokens):
            raise UserError("digits tokenizer: a special token is listed twice")
        clash = [t for t in special_tokens if t in _STOI]
        if clash:
            raise UserError(f"digits tokenizer: special token {clash[0]!r} is a digit or space")
        super().__init__({t: len(ALPHABET) + k for k, t in enumerate(special_tokens)})

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int = 0,
              special_tokens: Sequence[str] = ()) -> DigitsTokenizer:
        """The vocabulary is fixed, so training only checks its arguments."""
        if not any(texts):
            raise UserError("cannot train a digits tokenizer on an empty corpus")
        tok = cls(tuple(special_tokens))
        if vocab_size and vocab_size != tok.vocab_size:
            raise UserError(f"the digits tokenizer has exactly {tok.vocab_size} ids "
                            f"(11 + {len(special_tokens)} special); vocab_size {vocab_size} "
                            "is not possible")
        return tok

    @property
    def vocab_size(self) -> int:
        return len(ALPHABET) + len(self.special_tokens)

    def _encode_ordinary(self, text: str) -> list[int]:
        try:
            return [_STOI[c] for c in text]
        except KeyError as e:
            if self.unk_id is not None:
                return [_STOI.get(c, self.unk_id) for c in text]
            raise UserError(f"the digits tokenizer encodes only 0-9 and space, not {e.args[0]!r}"
                            ) from None

    def _knows(self, char: str) -> bool:
        return char in _STOI

    def _piece_bytes(self, i: int, prev: int | None) -> bytes:
        return _BYTES[i]

    def _token_str(self, i: int) -> str:
        return ALPHABET[i]

    def _str_to_id(self, token: str) -> int | None:
        return _STOI.get(token)

    def _payload(self) -> dict[str, Any]:
        return {"alphabet": ALPHABET}

    @classmethod
    def _from_payload(cls, data: dict[str, Any], where: str) -> DigitsTokenizer:
        if data.get("alphabet") != ALPHABET:
            raise bad_file(where, f"digits alphabet must be {ALPHABET!r}")
        specials = read_specials(data, where)
        check_ids_dense([*range(len(ALPHABET)), *specials.values()], where)
        return cls(sorted(specials, key=specials.__getitem__))
