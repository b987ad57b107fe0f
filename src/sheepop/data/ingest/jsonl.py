"""JSON Lines (.jsonl, .ndjson; plain, gzip or zstd) -> one document per line, streamed.

Each line is a JSON object; the document is the string at `text_field`, a key or a dotted
path into nested objects ("meta.body" is obj["meta"]["body"]). A line that is not valid JSON,
not an object, lacks the field, or holds something other than a string there gives no document:
it is counted in the file's `RecordSkips` with its line number (1-based), never an error.
Blank lines are ignored (many writers end files with one). The compression is told by the
bytes (gzip 1f 8b, zstd 28 b5 2f fd), not the name; the file is decompressed as it is read, in
bounded pieces (lines.py), so memory holds at most MAX_LINE_BYTES of one line whatever the
file's or the line's size: a longer line is skipped and counted ("line longer than 32 MiB").
A line nested past the JSON parser's depth is counted ("nested too deeply") and the lines
after it are read. Corrupt compressed data ends the file where it starts (counted as
`unreadable from here`), and so does a stream that decompresses to more than MAX_RATIO times
its compressed size (a compression bomb), keeping the lines read before it.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from sheepop.data.ingest.lines import (
    MAX_LINE_BYTES,
    MAX_RATIO,
    RATIO_FLOOR_BYTES,
    BoundedLines,
    RatioExceeded,
    size_name,
)
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
def open_stream(path: str | Path) -> Iterator[tuple[IO[bytes], Callable[[], int] | None]]:
    """(the file's bytes, decompressed when they start with a gzip or zstd header; a function
    telling how many compressed bytes were consumed, None for a plain file)."""
    with open(path, "rb") as raw:
        head = raw.peek(4)[:4]
        if head.startswith(GZIP_MAGIC):
            with gzip.GzipFile(fileobj=raw) as stream:
                yield stream, raw.tell
        elif head.startswith(ZSTD_MAGIC):
            import zstandard  # only needed for .zst files

            with zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True) as z:
                yield z, raw.tell
        else:
            yield raw, None


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
    `skips`, with reasons: not valid JSON, nested too deeply, not a JSON object, no field 'F',
    'F' not a string, line longer than N; and once, where reading stopped: unreadable from
    here, or decompressed over Rx its size, not read further (lines.py: the limits)."""

    def __init__(self, path: str | Path, text_field: str = "text",
                 max_line_bytes: int = MAX_LINE_BYTES, max_ratio: float = MAX_RATIO,
                 ratio_floor: int = RATIO_FLOOR_BYTES) -> None:
        self.path = Path(path)
        self.text_field = text_field
        self.field = field_path(text_field)
        self.max_line_bytes = max_line_bytes
        self.max_ratio = max_ratio
        self.ratio_floor = ratio_floor
        self.decompressed = 0  # bytes of the stream read, once documents() has run

    def documents(self, skips: RecordSkips) -> Iterator[tuple[int, str]]:
        too_long = f"line longer than {size_name(self.max_line_bytes)}"
        lines: BoundedLines | None = None
        try:
            with open_stream(self.path) as (stream, compressed_tell):
                lines = BoundedLines(stream, compressed_tell, self.max_line_bytes,
                                     self.max_ratio, self.ratio_floor)
                for number, line in lines:
                    if line is None:
                        skips.add(too_long, number)
                        continue
                    try:
                        obj = json.loads(line)
                    except ValueError:  # also UnicodeDecodeError: bytes that are not UTF-8
                        skips.add("not valid JSON", number)
                        continue
                    except RecursionError:  # [[[[... past the parser's depth
                        skips.add("nested too deeply", number)
                        continue
                    del line  # a line near the limit is not held while its text is stored
                    if not isinstance(obj, dict):
                        skips.add("not a JSON object", number)
                        continue
                    text = lookup(obj, self.field)
                    if text is _MISSING:
                        skips.add(f"no field '{self.text_field}'", number)
                    elif not isinstance(text, str):
                        skips.add(f"'{self.text_field}' not a string", number)
                    else:
                        del obj
                        yield number, text
        except RatioExceeded as e:
            assert lines is not None
            skips.add(f"{e}, not read further", lines.number)
        except _stream_errors() as e:
            skips.add(f"unreadable from here: {type(e).__name__}",
                      lines.number if lines is not None else 1)
        finally:
            if lines is not None:
                self.decompressed = lines.decompressed
