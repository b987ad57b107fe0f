"""Bytes of a text file -> str pieces, in whichever common encoding the file is in.

The order (FIELD-NOTES, 19 encodings tested): a byte-order mark first; then NUL bytes, which
mean binary unless they fall in the every-other-byte pattern of BOM-less UTF-16; then strict
UTF-8; then the charset-normalizer detector, corrected for Latin-script text by the
alphabets of legacy.py (cp1252 first); then UTF-8 with replacement. The choice is made
on the first SAMPLE_BYTES (the whole file for most files) and the file is then decoded in
CHUNK_BYTES pieces, so memory stays bounded for any file size. A file where more than
MAX_REPLACED_FRACTION of the characters had to be replaced by U+FFFD is rejected: its bytes
were not text in the encoding chosen.

A declaration inside the file (an HTML `<meta charset>`, a UTF-8 BOM in front of cp1252
bytes) is a claim, not a fact: a claim the bytes contradict is ignored.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterator
from pathlib import Path

from charset_normalizer import from_bytes

from sheepop.data.ingest.legacy import choose_latin
from sheepop.data.ingest.record import Skipped

SAMPLE_BYTES = 1 << 20
CHUNK_BYTES = 1 << 20
BINARY_PROBE_BYTES = 8192
MAX_REPLACED_FRACTION = 0.01
MAX_CONTROL_FRACTION = 0.01
# C0/C1 control characters other than tab, line feed, vertical tab, form feed, carriage return
# and escape (which shows up in terminal logs): plenty of them means binary, not text.
_CONTROLS = re.compile("[\x00-\x08\x0e-\x1a\x1c-\x1f\x7f-\x9f]")

_BOMS = (  # longest first: the UTF-32-LE mark starts with the UTF-16-LE one
    (codecs.BOM_UTF32_LE, "utf-32"),
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)


def _decodes(data: bytes, encoding: str, complete: bool) -> bool:
    """Whether `data` decodes strictly; a multi-byte character cut at the end of an
    incomplete sample does not count against it."""
    try:
        codecs.getincrementaldecoder(encoding)("strict").decode(data, complete)
        return True
    except (UnicodeDecodeError, LookupError):
        return False


def _utf16_without_bom(probe: bytes) -> str | None:
    """'utf-16-le'/'utf-16-be' when NUL bytes sit at odd/even offsets the way mostly-Latin
    UTF-16 text puts them, else None."""
    if len(probe) < 32:  # too few bytes to tell a pattern from chance
        return None
    even, odd = probe[0::2], probe[1::2]
    nul_even, nul_odd = even.count(0) / len(even), odd.count(0) / len(odd)
    if nul_odd > 0.3 and nul_even < 0.05:
        return "utf-16-le"
    if nul_even > 0.3 and nul_odd < 0.05:
        return "utf-16-be"
    return None


def choose_encoding(sample: bytes, complete: bool) -> str:
    """The codec to read a file whose first bytes are `sample` (all of it when `complete`).

    Raises Skipped("binary file") when the bytes are not text.
    """
    for bom, encoding in _BOMS:
        if sample.startswith(bom):
            if _decodes(sample, encoding, complete):
                return encoding
            sample = sample[len(bom):]  # the mark lied: judge the bytes after it
            break
    probe = sample[:BINARY_PROBE_BYTES]
    if b"\x00" in probe:
        utf16 = _utf16_without_bom(probe)
        if utf16 and _decodes(sample, utf16, complete):
            return utf16
        raise Skipped("binary file", "NUL bytes")
    if _decodes(sample, "utf-8", complete):
        return "utf-8"
    return _detected(sample, complete) or "utf-8"  # replaced; rejected if that is too much


_ASCII_LETTERS = bytes(range(65, 91)) + bytes(range(97, 123))
_HIGH_BYTES = bytes(range(128, 256))
_SINGLE_BYTE = ("cp125", "iso8859", "latin", "mac_", "cp4", "cp7", "cp8", "hp_roman", "koi8")


def _latin_script(sample: bytes) -> bool:
    """Whether `sample` is Latin-script text in an ASCII-based code page: most of its letters
    are ASCII ones (in Cyrillic, Greek, Hebrew or Arabic text nearly none are)."""
    ascii_letters = len(sample) - len(sample.translate(None, _ASCII_LETTERS))
    high = len(sample) - len(sample.translate(None, _HIGH_BYTES))
    return 0 < high < ascii_letters


def _detected(sample: bytes, complete: bool) -> str | None:
    """The detector's choice for `sample`; when that reads as Latin-script text from a
    single-byte code page, the code page whose reading fits a language's alphabet, cp1252
    first (legacy.py: on short Western text the detector often takes a neighbouring page that
    turns "ç" into "ē")."""
    matches = [m for m in from_bytes(sample) if _decodes(sample, m.encoding, complete)]
    if not matches:
        return None
    best = matches[0].encoding
    if not best.startswith(_SINGLE_BYTE) or not _latin_script(sample):
        return best
    singles = [m.encoding for m in matches if m.encoding.startswith(_SINGLE_BYTE)]
    return choose_latin(sample, complete, singles) or best


class TextFile:
    """Iterate a text file's decoded pieces; then `encoding`, `characters`, `replaced` tell
    what was found, and `check()` raises Skipped when too much had to be replaced."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.encoding = ""
        self.characters = 0
        self.replaced = 0
        self.controls = 0

    def __iter__(self) -> Iterator[str]:
        with open(self.path, "rb") as f:
            sample = f.read(SAMPLE_BYTES)
            complete = len(sample) < SAMPLE_BYTES or not f.peek(1)
            self.encoding = choose_encoding(sample, complete)
            # The codecs that own a BOM strip it; any other BOM here was a false claim.
            data = sample if self.encoding in ("utf-8-sig", "utf-16", "utf-32") \
                else _strip_bom(sample)
            decoder = codecs.getincrementaldecoder(self.encoding)("replace")
            while True:
                final = not data
                piece = decoder.decode(data, final)
                if piece:
                    self.characters += len(piece)
                    self.replaced += piece.count("\ufffd")
                    self.controls += sum(1 for _ in _CONTROLS.finditer(piece))
                    yield piece
                if final:
                    return
                data = f.read(CHUNK_BYTES)

    def check(self) -> None:
        if self.characters and self.controls > MAX_CONTROL_FRACTION * self.characters:
            raise Skipped("binary file", f"{self.controls} control characters")
        if self.characters and self.replaced > MAX_REPLACED_FRACTION * self.characters:
            raise Skipped("bad encoding", f"{self.replaced} of {self.characters} characters "
                          f"are not valid {self.encoding}")


def _strip_bom(sample: bytes) -> bytes:
    """Drop a byte-order mark (a UTF-8 BOM in front of cp1252 bytes would otherwise decode
    as three junk characters)."""
    for bom, _ in _BOMS:
        if sample.startswith(bom):
            return sample[len(bom):]
    return sample
