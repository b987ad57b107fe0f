"""Special tokens written in text (e.g. "<|eos|>"), found whole so that no tokenizer kind ever
splits or merges them: the one matcher behind `Tokenizer.encode` and BPE training's counts."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import regex


class SpecialMatcher:
    """Finds special tokens written in text, whole, so they are never split or merged."""

    def __init__(self, special_tokens: Mapping[str, int]) -> None:
        self.ids = dict(special_tokens)
        # Longest first, so that a special token that is a prefix of another never wins.
        names = sorted(self.ids, key=lambda t: (-len(t), t))
        self._re = regex.compile("|".join(regex.escape(t) for t in names)) if names else None

    def split(self, text: str) -> Iterator[tuple[str, int | None]]:
        """(ordinary text, None) and (special token, its id) pieces of `text`, in order."""
        if self._re is None:
            if text:
                yield text, None
            return
        start = 0
        for m in self._re.finditer(text):
            if m.start() > start:
                yield text[start:m.start()], None
            yield m.group(), self.ids[m.group()]
            start = m.end()
        if start < len(text):
            yield text[start:], None
