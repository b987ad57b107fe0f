"""What ingestion records about each file, and how an extractor says "skip this file".

Every file the walk meets gets one `FileRecord`; the records end up, in discovery order, in the
"files" list of meta.json. A skip carries a short fixed `code` (the summary counts files by it)
and a free-form `detail` for the one file (e.g. the PDF library's own message).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

USED = "used"
SKIPPED = "skipped"

# The file types the summary table lists, in its order.
TYPES = ("text", "html", "code", "pdf", "image", "other")


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
    # Where the normalised text sits in the worker's document store, and its hash (for dedup).
    store: str | None = field(default=None, repr=False)
    offset: int = field(default=0, repr=False)
    nbytes: int = field(default=0, repr=False)
    digest: str | None = field(default=None, repr=False)

    def skip(self, code: str, detail: str = "") -> FileRecord:
        self.status, self.reason_code = SKIPPED, code
        self.reason = f"{code}: {detail}" if detail else code
        self.characters, self.store = 0, None
        return self

    def to_meta(self) -> dict[str, Any]:
        """The public per-file entry: path, type, language (code), bytes, characters, tokens,
        status, reason (empty when used), and encoding/pages where they apply."""
        d = asdict(self)
        for private in ("reason_code", "store", "offset", "nbytes", "digest"):
            d.pop(private)
        for optional in ("language", "encoding", "pages"):
            if d[optional] is None:
                d.pop(optional)
        return d
