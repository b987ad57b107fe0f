"""JSON Lines (.jsonl, .ndjson; plain, gzip or zstd) -> one document per line, streamed.

Each line is a JSON object; the document is the string at `text_field`, a key or a dotted
path into nested objects ("meta.body" is obj["meta"]["body"]). A line that is not valid JSON,
not an object, lacks the field, or holds something other than a string there gives no document:
it is counted in the file's `RecordSkips` with its line number (1-based), never an error.
Blank lines are ignored (many writers end files with one). The compression is told by the
bytes (gzip 1f 8b, zstd 28 b5 2f fd), not the name; the file is decompressed as it is read, so
memory holds one line at a time whatever the file's size. Corrupt compressed data ends the file
where it starts (counted as `unreadable from here`), keeping the lines read before it.
"""

from __future__ import annotations

import gzip
import io
import json
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from sheepop.data.ingest.record import RecordSkips

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_MISSING = object()


def field_path(text_field: str) -> tuple[str, ...]:
    """'meta.body' -> ('meta', 'body')."""
    return tuple(text_field.split("."))


def lookup(obj: Any, path: tuple[str, ...]) -> Any:
    """obj[path[0]][path[1]]..., or _MISSING when a step is not an object holding that key."""
    for key in path:
        if not isinstance(obj, dict) or key not in obj:
            return _MISSING
        obj = obj[key]
    return obj


@contextmanager
def open_stream(path: str | Path) -> Iterator[IO[bytes]]:
    """The file's bytes, decompressed when they start with a gzip or zstd header."""
    with open(path, "rb") as raw:
        head = raw.peek(4)[:4]
        if head.startswith(GZIP_MAGIC):
            with gzip.GzipFile(fileobj=raw) as stream:
                yield stream
        elif head.startswith(ZSTD_MAGIC):
            import zstandard  # only needed for .zst files

            with zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True) as z:
                yield io.BufferedReader(z, buffer_size=1 << 20)
        else:
            yield raw


def _stream_errors() -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = [OSError, EOFError, zlib.error]
    try:
        import zstandard
        errors.append(zstandard.ZstdError)
    except ImportError:  # pragma: no cover (a declared dependency)
        pass
    return tuple(errors)


class JsonLinesFile:
    """Iterate (line number, text) for each line that holds a document; skipped lines go to
    `skips`, with reasons: not valid JSON, not a JSON object, no field 'F', 'F' not a string."""

    def __init__(self, path: str | Path, text_field: str = "text") -> None:
        self.path = Path(path)
        self.text_field = text_field
        self.field = field_path(text_field)

    def documents(self, skips: RecordSkips) -> Iterator[tuple[int, str]]:
        number = 0
        try:
            with open_stream(self.path) as stream:
                for number, line in enumerate(stream, 1):  # noqa: B007 (used after the loop)
                    if not line.strip():
                        continue
                    try:
                        obj = json.loads(line)
                    except ValueError:  # also UnicodeDecodeError: bytes that are not UTF-8
                        skips.add("not valid JSON", number)
                        continue
                    if not isinstance(obj, dict):
                        skips.add("not a JSON object", number)
                        continue
                    text = lookup(obj, self.field)
                    if text is _MISSING:
                        skips.add(f"no field '{self.text_field}'", number)
                    elif not isinstance(text, str):
                        skips.add(f"'{self.text_field}' not a string", number)
                    else:
                        yield number, text
        except _stream_errors() as e:
            skips.add(f"unreadable from here: {type(e).__name__}", number + 1)
