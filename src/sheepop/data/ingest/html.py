"""HTML -> its readable text, with the standard library's `html.parser`, fed piece by piece.

Script, style, the title and similar elements are dropped; block elements become line breaks
(one for a line-level element such as <br> or <li>, a blank line for a paragraph-level one);
whitespace
in running text collapses to one space, except inside <pre>, which is kept exactly. Entities
(&amp;, &#233;) are decoded by the parser (convert_charrefs).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from html.parser import HTMLParser

_SKIP = frozenset({"script", "style", "noscript", "template", "svg", "title"})
_PARAGRAPH = frozenset({
    "p", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "blockquote", "table", "ul", "ol", "dl",
    "section", "article", "header", "footer", "nav", "aside", "main", "figure", "form",
    "fieldset", "address", "details", "hr",
})
_LINE = frozenset({"br", "li", "tr", "div", "dt", "dd", "caption", "figcaption", "summary",
                   "option", "label", "legend"})
_CELL = frozenset({"td", "th"})
_SPACES = re.compile(r"\s+")


class _TextParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []
        self._skip_depth = 0
        self._pre_depth = 0
        self._breaks = 0          # line breaks owed before the next text
        self._space = False       # a space owed before the next text on this line
        self._line_start = True
        self._started = False     # nothing is written before the first text

    # Whitespace is owed rather than written, so that no line ends or starts with spaces and
    # at most one blank line separates blocks, however the markup is nested.
    def _owe_break(self, n: int) -> None:
        self._breaks = max(self._breaks, n)
        self._space = False

    def _write(self, text: str) -> None:
        if self._breaks and self._started:
            self.out.append("\n" * self._breaks)
            self._line_start = True
        elif self._space and not self._line_start:
            self.out.append(" ")
        self._breaks, self._space = 0, False
        self.out.append(text)
        self._started = True
        self._line_start = text.endswith("\n")

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag in _SKIP:
            self._skip_depth += 1
            return
        self._block(tag)
        if tag == "pre":
            self._pre_depth += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in _SKIP:
            self._skip_depth = max(0, self._skip_depth - 1)
            return
        if tag == "pre":
            self._pre_depth = max(0, self._pre_depth - 1)
        if tag != "br":
            self._block(tag)

    def handle_startendtag(self, tag: str, attrs: list) -> None:
        if tag not in _SKIP:
            self._block(tag)

    def _block(self, tag: str) -> None:
        if tag in _PARAGRAPH:
            self._owe_break(2)
        elif tag in _LINE:
            self._owe_break(1)
        elif tag in _CELL and not self._line_start:
            self._space = True

    def handle_data(self, data: str) -> None:
        if self._skip_depth:
            return
        if self._pre_depth:
            if data:
                self._write(data)
            return
        collapsed = _SPACES.sub(" ", data)
        if collapsed.startswith(" "):
            self._space = True
            collapsed = collapsed[1:]
        trailing = collapsed.endswith(" ")
        collapsed = collapsed.rstrip(" ")
        if collapsed:
            self._write(collapsed)
        if trailing:
            self._space = True


def html_to_text(pieces: Iterable[str]) -> Iterator[str]:
    """Feed decoded HTML pieces through the parser; yield the text as it becomes known."""
    parser = _TextParser()
    for piece in pieces:
        parser.feed(piece)
        if parser.out:
            yield "".join(parser.out)
            parser.out.clear()
    parser.close()
    if parser._started:
        parser.out.append("\n")
    yield "".join(parser.out)
