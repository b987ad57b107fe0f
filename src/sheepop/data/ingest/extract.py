"""One file -> its stored, normalised documents (or a skip with its reason), in a worker.

`init_worker` opens the process's own document store; `extract_file` classifies a file by its
magic bytes and extension and runs the reader for its type. A text, HTML, code, PDF or image
file is one document, streamed through the normaliser into the store. A JSON Lines or Parquet
file is one document per line or row; the lines and rows that hold none are counted with their
numbers. The record that comes back says where each document is. A problem with one file never
stops the run: it becomes that file's skip reason.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from sheepop.data.ingest.filetypes import classify
from sheepop.data.ingest.html import html_to_text
from sheepop.data.ingest.jsonl import JsonLinesFile
from sheepop.data.ingest.parquet import ParquetFile
from sheepop.data.ingest.record import MULTI_DOCUMENT, USED, FileRecord, Skipped
from sheepop.data.ingest.store import DocWriter
from sheepop.data.ingest.text import TextFile
from sheepop.words import plural

HEAD_BYTES = 8192
STORE_PREFIX = "docs-"  # a worker's store is docs-<name or pid>.txt


@dataclass(frozen=True)
class ExtractOptions:
    ocr_lang: str = "eng"
    text_field: str = "text"  # JSON Lines / Parquet: the key, column or dotted path of the text
    max_bytes: int = 0        # stop reading a file after this much text (0: never)


_writer: DocWriter | None = None
_options = ExtractOptions()


def init_worker(store_dir: str, options: ExtractOptions, name: str | None = None) -> None:
    """Open this process's document store (docs-<name or pid>.txt in `store_dir`)."""
    global _writer, _options
    _writer = DocWriter(Path(store_dir) / f"{STORE_PREFIX}{name or os.getpid()}.txt")
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
        from sheepop.data.ingest.pdf import PdfFile  # pdfium: loaded for PDFs only

        reader = PdfFile(path)
        return reader, reader
    from sheepop.data.ingest.image import ImageFile  # Pillow, pytesseract: for images only

    reader = ImageFile(path, lang=_options.ocr_lang)
    return reader, reader


def _one_document(path: str, record: FileRecord, writer: DocWriter) -> FileRecord:
    writer.begin()
    pieces, reader = _pieces(path, record)
    for piece in pieces:
        writer.write(piece)
        if _options.max_bytes and writer.written >= _options.max_bytes:
            break  # `sheepop train` needs no more: the rest of a 500 MB file is never read
    if isinstance(reader, TextFile):
        reader.check()
        record.encoding = reader.encoding
    else:
        record.pages = reader.pages  # type: ignore[attr-defined]
    offset, nbytes, digest = writer.commit()
    if not writer.has_text:
        writer.rollback()
        return record.skip("no text")
    record.docs.add(offset, nbytes, digest, 0, writer.characters)
    return record


def _many_documents(path: str, record: FileRecord, writer: DocWriter) -> FileRecord:
    reader = JsonLinesFile(path, _options.text_field) if record.type == "jsonl" \
        else ParquetFile(path, _options.text_field)
    written = 0
    for where, text in reader.documents(record.skipped_records):
        added = writer.add(text)
        if added is None:
            record.skipped_records.add("empty text", where)
            continue
        record.docs.add(*added, where, writer.characters)
        written += added[1]
        if _options.max_bytes and written >= _options.max_bytes:
            break  # `sheepop train` needs no more than this
    if not record.docs:
        skips = record.skipped_records
        return record.skip("no documents", f"{plural(skips.total, record.unit)} skipped: "
                           f"{skips.describe(record.unit)}" if skips.total else "empty")
    return record


OUTPUT_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}
"""Errors of the output's disk (full, over quota): they stop `prepare` naming the output
(sheepop.cli.writing), instead of skipping each input as unreadable."""


def extract_file(task: tuple[str, str]) -> FileRecord:
    """task = (path to open, path to report) -> the file's record; its documents are in the
    store at record.store, where record.docs says."""
    path, shown = task
    record = FileRecord(path=shown)
    head = _head(path, record)
    if head is None:
        return record
    record.type, record.language = classify(path, head)
    if record.bytes == 0:
        return record.skip("empty file")
    if record.type == "other":
        return record.skip("unsupported type", Path(shown).suffix.lower() or "no extension")
    return _extract(path, record)


def _head(path: str, record: FileRecord) -> bytes | None:
    """The file's first HEAD_BYTES (its size in record.bytes), or None with the record
    skipped: not a regular file (a FIFO or a device swapped in since the walk), unreadable."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):  # replaced by a FIFO or a device since the walk
            record.skip("not a regular file")
            return None
        record.bytes = st.st_size
        # Non-blocking: should a FIFO be swapped in between the stat and here, opening it
        # returns at once instead of waiting for a writer; fstat then tells.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with open(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                record.skip("not a regular file")
                return None
            return f.read(HEAD_BYTES)
    except OSError as e:
        record.skip("unreadable", e.strerror or str(e))
        return None


def _extract(path: str, record: FileRecord) -> FileRecord:
    """The file's documents written to this worker's store, all or none: a file that fails
    part way is rolled back and skipped with the reason (a full output disk stops the run)."""
    writer = _writer
    assert writer is not None, "init_worker was not called"
    start = writer.tell()
    try:
        if record.type in MULTI_DOCUMENT:
            _many_documents(path, record, writer)
        else:
            _one_document(path, record, writer)
    except Skipped as s:
        writer.rollback(start)
        return record.skip(s.code, s.detail)
    except OSError as e:
        writer.rollback(start)
        if e.errno in OUTPUT_FULL:  # the store we write, not this input: the run cannot go on
            raise
        return record.skip("unreadable", e.strerror or str(e))
    except Exception as e:  # noqa: BLE001  a library failing on one odd file must not stop the run
        writer.rollback(start)
        return record.skip("extraction error", f"{type(e).__name__}: {e}")
    finally:
        writer.flush()
    if record.status == USED or record.docs:
        record.store = writer.path.name
        record.characters = sum(record.docs.characters)
        record.documents = len(record.docs)
        record.status = USED
    return record
