"""What ingestion records about each file and its documents, and how an extractor says "skip".

Every file the walk meets gets one `FileRecord`; the records end up, in discovery order, in the
"files" list of meta.json. A skip carries a short fixed `code` (the summary counts files by it)
and a free-form `detail` for the one file (e.g. the PDF library's own message).

A file gives one document (text, HTML, code, PDF, image) or many (JSON Lines: one per line;
Parquet: one per row). `Documents` is where a file's documents went in the worker's store, as
flat arrays (a million lines travel back as a few MB, not a million objects); `RecordSkips`
counts the lines or rows that gave no document, by reason, with the first few line/row numbers.
"""

from __future__ import annotations

import re
from array import array
from dataclasses import dataclass, field, fields
from typing import Any

USED = "used"
SKIPPED = "skipped"

# The file types the summary table lists, in its order.
TYPES = ("text", "html", "code", "pdf", "image", "jsonl", "parquet", "other")
# Types whose files hold many documents, one per line (jsonl) or row (parquet).
MULTI_DOCUMENT = frozenset({"jsonl", "parquet"})
FIRST_LOCATIONS = 5  # line/row numbers kept per skip reason and file

# Lone surrogates (the bytes of a name that is not UTF-8, as os.fsdecode keeps them) and
# control characters (a newline or a terminal escape in a name): shown as backslash escapes.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def printable(path: str) -> str:
    """`path` as it is shown and written to meta.json: valid UTF-8 text on one line.

    A byte of the name that is not UTF-8 (b"caf\\xe9.txt", read back by os.fsdecode as
    "caf\\udce9.txt") becomes the four characters \\xe9, as does a control character; the
    file itself is still opened by its real name."""
    if not _UNPRINTABLE.search(path):
        return path

    def escape(m: re.Match) -> str:
        c = ord(m.group())
        if 0xDC80 <= c <= 0xDCFF:  # the byte os.fsdecode could not decode
            return f"\\x{c - 0xDC00:02x}"
        return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"

    return _UNPRINTABLE.sub(escape, path)


class Skipped(Exception):  # noqa: N818 (a control-flow signal, not an error)
    """Raised by an extractor: this file gives no document, for the reason `code` (+ detail)."""

    def __init__(self, code: str, detail: str = "") -> None:
        super().__init__(f"{code}: {detail}" if detail else code)
        self.code = code
        self.detail = detail

    @property
    def reason(self) -> str:
        return f"{self.code}: {self.detail}" if self.detail else self.code


@dataclass
class Documents:
    """A file's documents in the store: byte offset, byte length, 64-bit hash of the text (for
    dedup), location in the file (line or row number, 1-based; 0 for a whole file) and
    characters."""

    offset: array = field(default_factory=lambda: array("q"))
    nbytes: array = field(default_factory=lambda: array("q"))
    digest: array = field(default_factory=lambda: array("q"))
    where: array = field(default_factory=lambda: array("q"))
    characters: array = field(default_factory=lambda: array("q"))

    def add(self, offset: int, nbytes: int, digest: int, where: int, characters: int) -> None:
        self.offset.append(offset)
        self.nbytes.append(nbytes)
        self.digest.append(digest)
        self.where.append(where)
        self.characters.append(characters)

    def __len__(self) -> int:
        return len(self.offset)


@dataclass
class RecordSkips:
    """Lines or rows of one file that gave no document: reason -> count, and reason -> the
    first FIRST_LOCATIONS line/row numbers."""

    counts: dict[str, int] = field(default_factory=dict)
    first: dict[str, list[int]] = field(default_factory=dict)

    def add(self, reason: str, where: int) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + 1
        first = self.first.setdefault(reason, [])
        if len(first) < FIRST_LOCATIONS:
            first.append(where)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def to_meta(self) -> dict[str, dict[str, Any]]:
        return {reason: {"count": n, "first": self.first[reason]}
                for reason, n in self.counts.items()}

    def describe(self, unit: str) -> str:
        """'not valid JSON: 2 (lines 4, 9); no field 'text': 1 (line 7)'."""
        parts = []
        for reason in sorted(self.counts, key=lambda r: self.first[r][0]):  # in file order
            n = self.counts[reason]
            where = ", ".join(map(str, self.first[reason]))
            more = ", ..." if n > len(self.first[reason]) else ""
            parts.append(f"{reason}: {n:,} ({unit}{'s' if n > 1 else ''} {where}{more})")
        return "; ".join(parts)


@dataclass
class FileRecord:
    """One file's line in meta.json (`to_meta`) plus what the pipeline needs in between."""

    path: str
    type: str = "other"
    bytes: int = 0
    status: str = SKIPPED
    reason: str = ""
    reason_code: str = ""
    language: str | None = None
    encoding: str | None = None
    pages: int | None = None
    characters: int = 0
    tokens: int = 0
    documents: int = 0
    outside: str | None = None  # the real path, for a file reached by a link out of the inputs
    skipped_records: RecordSkips = field(default_factory=RecordSkips)
    # Which worker's document store holds the normalised text, and where (private).
    store: str | None = field(default=None, repr=False)
    docs: Documents = field(default_factory=Documents, repr=False)

    def skip(self, code: str, detail: str = "") -> FileRecord:
        self.status, self.reason_code = SKIPPED, code
        detail = printable(detail)  # a library's message may quote an undecodable file name
        self.reason = f"{code}: {detail}" if detail else code
        self.characters, self.store, self.documents, self.docs = 0, None, 0, Documents()
        return self

    @property
    def unit(self) -> str:
        return "row" if self.type == "parquet" else "line"

    def to_meta(self) -> dict[str, Any]:
        """The public per-file entry: path, type, language (code), bytes, characters, tokens,
        status, reason (empty when used), encoding/pages where they apply, `outside` (the real
        path of a file read through a link leading out of the inputs), and for JSON Lines
        and Parquet the documents kept and the lines/rows skipped
        ({reason: {"count": n, "first": [line numbers]}})."""
        d = {f.name: getattr(self, f.name) for f in fields(self)
             if f.name not in ("reason_code", "store", "docs", "skipped_records")}
        for optional in ("language", "encoding", "pages", "outside"):
            if d[optional] is None:
                d.pop(optional)
        if self.type in MULTI_DOCUMENT:
            d["skipped_records"] = self.skipped_records.to_meta()
        else:
            d.pop("documents")
        return d
