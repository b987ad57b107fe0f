"""Bytes of a text file -> str pieces, in whichever common encoding the file is in.

The order (FIELD-NOTES, 19 encodings tested): a byte-order mark first; then NUL bytes, which
mean binary unless they fall in the every-other-byte pattern of BOM-less UTF-16; then strict
UTF-8; then the charset-normalizer detector; then UTF-8 with replacement. The choice is made
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
    for encoding in _detected(sample):
        if _decodes(sample, encoding, complete):
            return _prefer_cp1252(sample, encoding)
    return "utf-8"  # with replacement; rejected below if that replaces too much


# When the detector scores several code pages exactly alike (French text decodes the same in
# cp1250 and cp1252 unless it holds one of the letters they disagree on), the most widely used
# one wins instead of the detector's arbitrary first.
_TIE_PREFERENCE = ("cp1252", "latin_1", "iso8859_15", "cp1250", "iso8859_2", "cp1251")


def _detected(sample: bytes) -> list[str]:
    """The detector's candidate encodings, best first, exact ties broken by _TIE_PREFERENCE."""
    matches = list(from_bytes(sample))
    if not matches:
        return []
    top = matches[0]
    tied = [m.encoding for m in matches
            if m.chaos == top.chaos and m.coherence == top.coherence]
    tied.sort(key=lambda e: _TIE_PREFERENCE.index(e) if e in _TIE_PREFERENCE
              else len(_TIE_PREFERENCE))
    return tied + [m.encoding for m in matches if m.encoding not in tied]


def _prefer_cp1252(sample: bytes, encoding: str) -> str:
    """cp1252 instead of another single-byte code page that reads the sample identically:
    the bytes give no evidence either way, and cp1252 is by far the most common."""
    if encoding == "cp1252" or not encoding.startswith(("cp125", "iso8859", "latin", "mac_")):
        return encoding
    try:
        same = sample.decode("cp1252") == sample.decode(encoding)
    except UnicodeDecodeError:
        return encoding
    return "cp1252" if same else encoding


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
