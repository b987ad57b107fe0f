"""Added tokens of a Hugging Face tokenizer.json: strings found whole in the text, never split.

As `tokenizers` does it:
1. tokens with `normalized: false` are found in the raw text; the text between them is then
   normalized, and tokens with `normalized: true` are found in that normalized text (their own
   content normalized the same way);
2. matching is leftmost-longest over all tokens of the set;
3. `single_word`: a match is dropped when a word character (\\w) touches it on either side;
4. `lstrip` / `rstrip`: the match swallows the whitespace to its left / right (but never text an
   earlier match took);
5. `special` only matters when decoding (skip_special drops special tokens, and sheepop treats
   them as its special tokens); it never changes how text is cut.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import regex

from sheepop.errors import UserError
from sheepop.files import shown

_WORD_CHAR = regex.compile(r"\w")
_SPACE = regex.compile(r"\s")
_SPACES = regex.compile(r"\s*")
FLAGS = ("single_word", "lstrip", "rstrip", "normalized", "special")


@dataclass(frozen=True)
class AddedToken:
    id: int
    content: str
    single_word: bool = False
    lstrip: bool = False
    rstrip: bool = False
    normalized: bool = False
    special: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "content": self.content,
                **{flag: getattr(self, flag) for flag in FLAGS}}


def read_added_tokens(data: Any, where: str) -> list[AddedToken]:
    """tokenizer.json's "added_tokens" list, checked."""
    if data is None:
        return []
    if not isinstance(data, list):
        raise UserError(f"{where}: 'added_tokens' must be a list")
    tokens = [_added_token(k, item, where) for k, item in enumerate(data)]
    if len({t.content for t in tokens}) != len(tokens) or len({t.id for t in tokens}) != \
            len(tokens):
        raise UserError(f"{where}: two added tokens have the same content or the same id")
    return tokens


def _added_token(k: int, item: Any, where: str) -> AddedToken:
    """Entry k of "added_tokens": an id, a content, and only the known flags, each a bool
    (normalized defaults to not special, the others to false)."""
    if not isinstance(item, dict) or type(item.get("id")) is not int or item["id"] < 0 \
            or not isinstance(item.get("content"), str) or not item["content"]:
        raise UserError(f"{where}: added token {k} must have a non-negative integer 'id' "
                        f"and a non-empty string 'content', not {shown(item)}")
    unknown = sorted(set(item) - {"id", "content", *FLAGS})
    if unknown:
        raise UserError(f"{where}: added token {item['content']!r} has the unknown field "
                        f"'{unknown[0]}'")
    flags = {f: item.get(f, f == "normalized" and not item.get("special", False))
             for f in FLAGS}
    if not all(isinstance(v, bool) for v in flags.values()):
        raise UserError(f"{where}: the flags of added token {item['content']!r} must be "
                        "true or false")
    return AddedToken(item["id"], item["content"], **flags)


Piece = tuple[str, "AddedToken | None"]


class AddedTokenMatcher:
    """Finds one set of added tokens (the raw or the normalized ones) in text."""

    def __init__(self, tokens: list[AddedToken], normalize: Callable[[str], str] | None) -> None:
        by_pattern: dict[str, AddedToken] = {}
        for t in tokens:
            pattern = normalize(t.content) if (t.normalized and normalize) else t.content
            if pattern:
                by_pattern.setdefault(pattern, t)
        self._tokens = by_pattern
        names = sorted(by_pattern, key=lambda p: (-len(p), p))  # longest first at a position
        self._re = regex.compile("|".join(map(regex.escape, names))) if names else None

    def split(self, text: str) -> list[Piece]:
        """(text, None) and (matched text, its token) pieces covering `text`, in order."""
        if self._re is None:
            return [(text, None)] if text else []
        pieces: list[Piece] = []
        taken = 0  # where the previous piece ended
        for m in self._re.finditer(text):
            start, stop = m.span()
            token = self._tokens[m.group()]
            if token.single_word and (
                    (start > 0 and _WORD_CHAR.match(text, start - 1))
                    or (stop < len(text) and _WORD_CHAR.match(text, stop))):
                continue
            if token.lstrip:
                while start > taken and _SPACE.match(text, start - 1):
                    start -= 1
            if token.rstrip:
                stop = _SPACES.match(text, stop).end()
            start = max(start, taken)
            if taken < start:
                pieces.append((text[taken:start], None))
            pieces.append((text[start:stop], token))
            taken = stop
        if taken < len(text):
            pieces.append((text[taken:], None))
        return pieces
