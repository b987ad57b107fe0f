"""PDF -> text, page by page, with pypdfium2 (Apache/BSD; ~2 ms a page, FIELD-NOTES).

pdfium marks a hyphen that ends a line with U+FFFE and drops the line break after it, so
"inter-\\nnational" comes out as "inter\\ufffenational": the mark is removed, joining the word.
Other producers leave "word-\\n" in the text layer; a hyphen between a letter and a line break
followed by a lower-case letter is joined the same way (a capital after the break suggests a
real hyphenated name, which is kept). Ligature code points (U+FB00..U+FB06: ff, fi, fl, ffi, ffl,
long st, st) are replaced by their NFKC letters; NFKC is *not* applied to the rest, since it
would also rewrite superscripts, full-width forms and other characters that carry meaning.

pdfium is not thread-safe: the pipeline runs it in worker processes, never in threads.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator
from pathlib import Path

import pypdfium2 as pdfium

from sheepop.data.ingest.record import Skipped

_LIGATURES = {cp: unicodedata.normalize("NFKC", chr(cp)) for cp in range(0xFB00, 0xFB07)}
_LINE_END_HYPHEN = re.compile(r"(?<=[^\W\d_])-[ \t]*\r?\n[ \t]*(?=[^\W\d_])")
_PDFIUM_PASSWORD_ERROR = 4


def fix_ligatures(text: str) -> str:
    """Replace each ligature code point by its letters (NFKC of that code point only)."""
    return text.translate(_LIGATURES)


def join_hyphenated(text: str) -> str:
    """Join words broken across lines: pdfium's U+FFFE marks, and "word-\\nword" where the
    second part starts with a lower-case letter."""
    text = re.sub("\ufffe(?:\r?\n)?", "", text)
    return _LINE_END_HYPHEN.sub(lambda m: "" if m.string[m.end()].islower() else m.group(), text)


def clean_page(text: str) -> str:
    return join_hyphenated(fix_ligatures(text))


class PdfFile:
    """Iterate the cleaned text of each page; `pages` holds the page count once opened."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.pages = 0

    def __iter__(self) -> Iterator[str]:
        try:
            doc = pdfium.PdfDocument(str(self.path))
        except pdfium.PdfiumError as e:
            if getattr(e, "err_code", None) == _PDFIUM_PASSWORD_ERROR:
                raise Skipped("encrypted PDF", "needs a password") from None
            raise Skipped("corrupt PDF", str(e)) from None
        try:
            self.pages = len(doc)
            for index in range(self.pages):
                try:
                    page = doc[index]
                    textpage = page.get_textpage()
                    text = textpage.get_text_range()
                    textpage.close()
                    page.close()
                except pdfium.PdfiumError as e:
                    raise Skipped("corrupt PDF", f"page {index + 1}: {e}") from None
                yield ("\n\n" if index else "") + clean_page(text).strip("\r\n")
            yield "\n"
        finally:
            doc.close()
