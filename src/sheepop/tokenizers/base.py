"""The one interface every tokenizer kind shares, its JSON file format, and streaming decode.

A tokenizer maps text to a list of integer ids and back. Every kind (char, word, bpe, digits)
subclasses `Tokenizer` and supplies three things:

- `_encode_ordinary(text)`: ids for text that holds no special token;
- `_piece_bytes(i, prev)`: the UTF-8 bytes token `i` contributes when it follows token `prev`
  (only the word tokenizer looks at `prev`, to decide on a space);
- `_payload()` / `_from_payload()`: what the kind adds to the JSON file.

Everything else (special tokens matched whole, by `sheepop.tokenizers.special_matcher`;
BOS/EOS, id checks, decode with replacement of invalid UTF-8, batches, the file format) lives
here, once; the checks each kind's reader makes of a file's fields in
`sheepop.tokenizers.file_checks`.

File format, one JSON object:
    {"format": "sheepop-tokenizer", "version": 1, "kind": "...",
     "special_tokens": {"<|bos|>": 0, ...}, ...what the kind adds,
     "chat_template": "..."}   (only once chat tokens were added: sheepop.tokenizers.chat_format)

Special tokens can be added to a trained tokenizer (`with_special_tokens`): they take new ids
at the end of the vocabulary, so every existing id keeps its meaning (and a model's rows stay
valid).
"""

from __future__ import annotations

import json
import operator
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from sheepop.errors import UserError
from sheepop.files import DocumentFormat, atomic_write_text, document_text, shown
from sheepop.tokenizers.file_checks import bad_file
from sheepop.tokenizers.special_matcher import SpecialMatcher

FORMAT = "sheepop-tokenizer"
VERSION = 1
TOKENIZER_FILE = DocumentFormat(FORMAT, VERSION, "sheepop tokenizer file")

BOS = "<|bos|>"
EOS = "<|eos|>"
PAD = "<|pad|>"
UNK = "<|unk|>"
DEFAULT_SPECIALS = (BOS, EOS, PAD, UNK)
"""The special tokens of the char and word kinds, in id order 0..3."""


class Tokenizer(ABC):
    """Text <-> ids. Subclasses set `kind` and implement the abstract methods below."""

    kind: ClassVar[str] = ""

    def __init__(self, special_tokens: Mapping[str, int]) -> None:
        self.special_tokens: dict[str, int] = dict(special_tokens)
        self._special_by_id: dict[int, str] = {i: t for t, i in self.special_tokens.items()}
        self._specials = SpecialMatcher(self.special_tokens)
        self.chat_template: str | None = None
        """Jinja text of the chat template (sheepop.tokenizers.chat_format), or None."""

    # ----- what a kind implements -------------------------------------------------------------

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Number of ids, special tokens included; ids are exactly 0 .. vocab_size - 1."""

    @abstractmethod
    def _encode_ordinary(self, text: str) -> list[int]:
        """Ids of `text`, which contains no special token."""

    @abstractmethod
    def _piece_bytes(self, i: int, prev: int | None) -> bytes:
        """Bytes that non-special token `i` adds to the output after token `prev`."""

    @abstractmethod
    def _token_str(self, i: int) -> str:
        """The printable, invertible name of non-special token `i` (see `id_to_token`)."""

    @abstractmethod
    def _str_to_id(self, token: str) -> int | None:
        """Inverse of `_token_str` for non-special tokens."""

    @abstractmethod
    def _payload(self) -> dict[str, Any]:
        """What this kind adds to the JSON file."""

    @classmethod
    @abstractmethod
    def _from_payload(cls, data: dict[str, Any], where: str) -> Tokenizer:
        """Rebuild from a parsed file; raise UserError naming `where` when it is malformed."""

    def _payload_with_specials(self, payload: dict[str, Any], added: dict[str, int]) -> None:
        """Change the parsed file `payload`, whose "special_tokens" already hold `added` (new
        ids after the last one), so that `_from_payload` reads it back. Nothing to do for kinds
        whose ids follow from "special_tokens" alone."""
        return None

    # ----- special tokens ---------------------------------------------------------------------

    @property
    def bos_id(self) -> int | None:
        return self.special_tokens.get(BOS)

    @property
    def eos_id(self) -> int | None:
        return self.special_tokens.get(EOS)

    @property
    def pad_id(self) -> int | None:
        return self.special_tokens.get(PAD)

    @property
    def unk_id(self) -> int | None:
        return self.special_tokens.get(UNK)

    def _required_special(self, name: str) -> int:
        i = self.special_tokens.get(name)
        if i is None:
            raise UserError(f"this {self.kind} tokenizer has no {name} token "
                            f"(it has: {', '.join(self.special_tokens) or 'no special tokens'})")
        return i

    def split_specials(self, text: str) -> Iterator[tuple[str, int | None]]:
        """Cut `text` into (ordinary text, None) and (special token, its id), in order."""
        return self._specials.split(text)

    def with_special_tokens(self, names: Sequence[str]) -> Tokenizer:
        """This tokenizer with each of `names` it lacks as a new special token: ids
        vocab_size, vocab_size + 1, ... in the order given. Existing ids never move (a
        model's embedding rows keep their meaning; it only needs rows for the new ids).
        Returns `self` when nothing is missing, else a new tokenizer."""
        bad = [t for t in names if not isinstance(t, str) or not t]
        if bad:
            raise UserError(f"a special token must be a non-empty string, not {shown(bad[0])}")
        missing = [t for t in dict.fromkeys(names) if t not in self.special_tokens]
        if not missing:
            return self
        added = {t: self.vocab_size + k for k, t in enumerate(missing)}
        # Through the file format, so the result is exactly what saving and loading it gives.
        payload = json.loads(self.to_json())
        payload["special_tokens"].update(added)
        self._payload_with_specials(payload, added)
        return type(self).from_document(payload, "tokenizer with added special tokens")

    # ----- encode -----------------------------------------------------------------------------

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """Ids of `text`. A special token written in the text (e.g. "<|eos|>") is matched whole."""
        if not isinstance(text, str):
            raise UserError(f"encode expects text (str), got {type(text).__name__}")
        ids: list[int] = [self._required_special(BOS)] if add_bos else []
        for piece, special in self.split_specials(text):
            if special is None:
                ids.extend(self._encode_ordinary(piece))
            else:
                ids.append(special)
        if add_eos:
            ids.append(self._required_special(EOS))
        return ids

    @property
    def special_affixes(self) -> tuple[list[int], list[int]]:
        """Ids the model's own tokenizer puts before / after a model input (none here)."""
        return [], []

    def encode_for_model(self, text: str) -> list[int]:
        """Ids as transformers' `tokenizer(text)["input_ids"]`: special_affixes around encode."""
        before, after = self.special_affixes
        return [*before, *self.encode(text), *after]

    def encode_batch(self, texts: Iterable[str], **kw: Any) -> list[list[int]]:
        return [self.encode(t, **kw) for t in texts]

    def count_unknown(self, text: str) -> int:
        """How many pieces of `text` this tokenizer cannot write (`unknown_pieces`)."""
        return sum(self.unknown_pieces(text).values())

    def unknown_pieces(self, texts: str | Iterable[str]) -> Counter[str]:
        """What this tokenizer cannot write, with counts (sheepop.tokenizers.unknown)."""
        from sheepop.tokenizers.unknown import unknown_characters
        return unknown_characters(self, texts)

    def _knows(self, char: str) -> bool:
        """Whether `char` survives a round trip (sheepop.tokenizers.unknown.round_trips)."""
        from sheepop.tokenizers.unknown import round_trips
        return round_trips(self, char)

    # ----- decode -----------------------------------------------------------------------------

    def check_id(self, i: Any) -> int:
        """`i` as an int, or UserError when it is not an id of this vocabulary."""
        try:
            i = operator.index(i)
        except TypeError:
            raise UserError(f"token id must be an integer, got {i!r}") from None
        if not 0 <= i < self.vocab_size:
            raise UserError(f"token id {i} is outside the vocabulary of this {self.kind} "
                            f"tokenizer (ids 0..{self.vocab_size - 1})")
        return i

    def _piece(self, i: int, prev: int | None, skip_special: bool) -> bytes:
        special = self._special_by_id.get(i)
        if special is not None:
            return b"" if skip_special else special.encode("utf-8")
        return self._piece_bytes(i, prev)

    def decode(self, ids: Iterable[int], skip_special: bool = False,
               errors: str = "replace") -> str:
        """Text of `ids`. Bytes that are not valid UTF-8 (e.g. a lone piece of a multi-byte
        character) become U+FFFD under errors="replace"; errors="strict" raises UserError."""
        out = bytearray()
        prev: int | None = None
        for raw in ids:
            i = self.check_id(raw)
            out += self._piece(i, prev, skip_special)
            if not (skip_special and i in self._special_by_id):
                prev = i
        return _utf8(bytes(out), errors)

    def decode_batch(self, batch: Iterable[Iterable[int]], **kw: Any) -> list[str]:
        return [self.decode(ids, **kw) for ids in batch]

    # ----- vocabulary -------------------------------------------------------------------------

    def id_to_token(self, i: int) -> str:
        """The token's name: special tokens as written, others as the kind shows them."""
        i = self.check_id(i)
        special = self._special_by_id.get(i)
        return special if special is not None else self._token_str(i)

    def token_to_id(self, token: str) -> int | None:
        """Inverse of `id_to_token`; None for a string that is not a token."""
        if token in self.special_tokens:
            return self.special_tokens[token]
        return self._str_to_id(token)

    def vocabulary_bytes(self) -> list[bytes | None]:
        """Each id's bytes as it writes them after another token (what a token mask over the
        vocabulary matches against the text: sheepop.generation.constraint); None for a special
        token, which writes no text. A kind whose bytes depend on the token before (word: its
        spaces) refuses with UserError."""
        prev = 0  # (any id: only "after the first token" matters, e.g. a metaspace's space)
        return [None if i in self._special_by_id else self._piece_bytes(i, prev)
                for i in range(self.vocab_size)]

    # ----- the file ---------------------------------------------------------------------------

    def to_json(self) -> str:
        """The tokenizer's file (see the module docstring), as text."""
        body = {"kind": self.kind, "special_tokens": dict(self.special_tokens),
                **self._payload()}
        if self.chat_template is not None:
            body["chat_template"] = self.chat_template
        return document_text(TOKENIZER_FILE, body, indent=1)

    @classmethod
    def from_document(cls, data: dict[str, Any], where: str) -> Tokenizer:
        """Rebuild from a parsed file of this kind (the kind's payload, then what every kind
        may carry: the chat template; a file without one, as every file before it, has none)."""
        tok = cls._from_payload(data, where)
        template = data.get("chat_template")
        if template is not None and not isinstance(template, str):
            raise bad_file(where, "'chat_template' must be a string")
        tok.chat_template = template
        return tok

    def save(self, path: str | Path) -> None:
        """Write the tokenizer's JSON file atomically (temporary name, then rename)."""
        atomic_write_text(path, self.to_json())

    def __repr__(self) -> str:
        return f"<{type(self).__name__} vocab_size={self.vocab_size}>"


def _utf8(data: bytes, errors: str) -> str:
    try:
        return data.decode("utf-8", errors)
    except UnicodeDecodeError as e:
        raise UserError(f"decoded bytes are not valid UTF-8 at byte {e.start} "
                        "(use errors='replace' to substitute U+FFFD)") from None
    except LookupError:
        raise UserError(f"unknown decode error handler {errors!r}") from None
