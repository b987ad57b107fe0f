"""Streaming decode: ids to text one token at a time, for generation that prints as it goes.

The concatenated pieces equal `tokenizer.decode(all_ids)` exactly: bytes that end in the middle
of a UTF-8 character are held back until the character is complete.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Iterator

from sheepop.errors import UserError
from sheepop.tokenizers.base import Tokenizer


class IncrementalDecoder:
    """Decode ids one at a time, for streaming generation, with output exactly equal to
    `tokenizer.decode(all_ids)`.

    A byte-level BPE token may end in the middle of a multi-byte UTF-8 character (an emoji is
    4 bytes, often split over 2-3 tokens). Those bytes are held back until the character is
    complete, so `step` returns "" rather than U+FFFD; `flush` releases what is left (replaced
    under errors="replace").

        dec = IncrementalDecoder(tok)
        for i in ids: print(dec.step(i), end="")
        print(dec.flush())
    """

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False,
                 errors: str = "replace") -> None:
        self.tokenizer = tokenizer
        self.skip_special = skip_special
        try:
            self._utf8 = codecs.getincrementaldecoder("utf-8")(errors)
        except LookupError:
            raise UserError(f"unknown decode error handler {errors!r}") from None
        self._prev: int | None = None

    def step(self, token_id: int) -> str:
        """The text that becomes certain once `token_id` is appended."""
        tok = self.tokenizer
        i = tok.check_id(token_id)
        data = tok._piece(i, self._prev, self.skip_special)
        if not (self.skip_special and i in tok._special_by_id):
            self._prev = i
        return self._decode(data, final=False)

    def flush(self) -> str:
        """What is still held back (an incomplete character), decoded as final."""
        return self._decode(b"", final=True)

    def _decode(self, data: bytes, final: bool) -> str:
        try:
            return self._utf8.decode(data, final)
        except UnicodeDecodeError as e:
            raise UserError(f"streamed bytes are not valid UTF-8 ({e.reason})") from None


def decode_stream(tokenizer: Tokenizer, ids: Iterable[int], skip_special: bool = False,
                  errors: str = "replace") -> Iterator[str]:
    """Yield text pieces as `ids` arrive; their concatenation equals `tokenizer.decode(ids)`."""
    dec = IncrementalDecoder(tokenizer, skip_special=skip_special, errors=errors)
    for i in ids:
        piece = dec.step(i)
        if piece:
            yield piece
    tail = dec.flush()
    if tail:
        yield tail
