"""One file -> one stored, normalised document (or a skip with its reason), in a worker.

`init_worker` opens the process's own document store; `extract_file` classifies a file by its
magic bytes and extension, runs the extractor for its type, streams the text through the
normaliser into the store, and returns the file's record. A problem with one file never stops
the run: it becomes that file's skip reason.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from sheepop.data.ingest.filetypes import classify
from sheepop.data.ingest.html import html_to_text
from sheepop.data.ingest.image import ImageFile
from sheepop.data.ingest.pdf import PdfFile
from sheepop.data.ingest.record import USED, FileRecord, Skipped
from sheepop.data.ingest.store import DocWriter
from sheepop.data.ingest.text import TextFile

HEAD_BYTES = 8192


@dataclass(frozen=True)
class ExtractOptions:
    ocr_lang: str = "eng"


_writer: DocWriter | None = None
_options = ExtractOptions()


def init_worker(store_dir: str, options: ExtractOptions, name: str | None = None) -> None:
    """Open this process's document store (docs-<name or pid>.txt in `store_dir`)."""
    global _writer, _options
    _writer = DocWriter(Path(store_dir) / f"docs-{name or os.getpid()}.txt")
    _options = options


def close_worker() -> None:
    global _writer
    if _writer is not None:
        _writer.close()
        _writer = None


def _pieces(path: str, record: FileRecord) -> tuple[Iterable[str], object]:
    """The text pieces of a file of record.type, and the reader (for its findings)."""
    if record.type in ("text", "code", "html"):
        reader = TextFile(path)
        return (html_to_text(reader) if record.type == "html" else reader), reader
    if record.type == "pdf":
        reader = PdfFile(path)
        return reader, reader
    reader = ImageFile(path, lang=_options.ocr_lang)
    return reader, reader


def extract_file(task: tuple[str, str]) -> FileRecord:
    """task = (path to open, path to report) -> the file's record; a used document is in the
    store at (record.store, record.offset, record.nbytes)."""
    path, shown = task
    record = FileRecord(path=shown)
    try:
        record.bytes = os.stat(path).st_size
        with open(path, "rb") as f:
            head = f.read(HEAD_BYTES)
    except OSError as e:
        return record.skip("unreadable", e.strerror or str(e))
    record.type, record.language = classify(path, head)
    if record.bytes == 0:
        return record.skip("empty file")
    if record.type == "other":
        return record.skip("unsupported type", Path(path).suffix.lower() or "no extension")
    assert _writer is not None, "init_worker was not called"
    _writer.begin()
    try:
        pieces, reader = _pieces(path, record)
        for piece in pieces:
            _writer.write(piece)
        if isinstance(reader, TextFile):
            reader.check()
            record.encoding = reader.encoding
        else:
            record.pages = reader.pages  # type: ignore[attr-defined]
        record.store, record.offset, record.nbytes, record.digest = \
            _writer.path.name, *_writer.commit()
    except Skipped as s:
        _writer.rollback()
        return record.skip(s.code, s.detail)
    except OSError as e:
        _writer.rollback()
        return record.skip("unreadable", e.strerror or str(e))
    except Exception as e:  # noqa: BLE001  a library failing on one odd file must not stop the run
        _writer.rollback()
        return record.skip("extraction error", f"{type(e).__name__}: {e}")
    if not _writer.has_text:
        _writer.rollback()
        return record.skip("no text")
    record.characters = _writer.characters
    record.status = USED
    return record
