"""The few helpers that turn numbers into the words of a message: counted nouns ("1 file",
"2 files") and durations ("5m 12s"), so that every command writes them the same way."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def plural(n: int, word: str, many: str | None = None) -> str:
    """'1 file', '0 files', '1,024 files'; `many` is the plural when it is not `word` + 's'."""
    return f"{n:,} {word if n == 1 else (many or word + 's')}"


def duration(seconds: float) -> str:
    """A time left or taken, to the second, in its two largest units: '45s', '5m 12s',
    '2h 05m'."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s // 3600}h {s % 3600 // 60:02d}m"


def near_match(word: str, known: Iterable[str]) -> str | None:
    """The known word closest to a misspelt one (difflib's ratio, at least 0.6), or None: the
    "did you mean" of every refusal (options, choices, commands, config keys)."""
    close = difflib.get_close_matches(word, [str(k) for k in known], n=1)
    return close[0] if close else None
