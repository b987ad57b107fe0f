"""Document normalisation, streamed: Unicode NFC and one line ending ("\\n").

Every extractor's text passes through `StreamNormalizer`, so a 1 GB text file is normalised
piece by piece in bounded memory and the result is exactly `normalize_text(whole_text)`.

Why cutting is safe: NFC only composes a character with the characters that follow it up to
the next starter, and no canonical composition takes an ASCII character as its second part.
So the text before a "\\n" (or, in a very long line, before any ASCII character) normalises
the same whether or not it is followed by the rest. A "\\r" at the end of a piece is held back,
since it may be the first half of "\\r\\n".
"""

from __future__ import annotations

import unicodedata

# A piece without a newline is held back at most this long before an ASCII cut is looked for.
MAX_HOLD_CHARS = 1 << 20


def normalize_line_endings(text: str) -> str:
    """CRLF and lone CR -> LF."""
    if "\r" not in text:
        return text
    return text.replace("\r\n", "\n").replace("\r", "\n")


def normalize_text(text: str) -> str:
    """Line endings to "\\n", then Unicode NFC."""
    return unicodedata.normalize("NFC", normalize_line_endings(text))


def _safe_cut(buf: str, max_hold: int) -> int:
    """The largest index i with buf[:i] safe to normalise on its own (0 when none)."""
    i = buf.rfind("\n")
    if i >= 0:
        return i + 1
    if len(buf) < max_hold:
        return 0
    for j in range(len(buf) - 1, 0, -1):
        if buf[j] < "\x80" and buf[j - 1] != "\r":
            return j
    return 0


class StreamNormalizer:
    """feed(piece) -> normalised text that is final; close() -> the rest.

    The concatenation of everything returned equals `normalize_text` of everything fed.
    """

    def __init__(self, max_hold: int = MAX_HOLD_CHARS) -> None:
        self._held = ""
        self._max_hold = max_hold

    def feed(self, piece: str) -> str:
        buf = self._held + piece
        cut = _safe_cut(buf, self._max_hold)
        if cut and buf[cut - 1] == "\r":  # maybe the first half of "\r\n"
            cut -= 1
        self._held = buf[cut:]
        return normalize_text(buf[:cut]) if cut else ""

    def close(self) -> str:
        buf, self._held = self._held, ""
        return normalize_text(buf)
