"""The non-blank lines of a (decompressing) byte stream, read in bounded pieces.

Iterating a file object line by line holds each whole line in memory, and a compressed file
can decompress to a line of any length: 262 KB of zstd is one 8 GiB line. `BoundedLines` reads
CHUNK_BYTES at a time and keeps at most `max_line_bytes` of the current line; the rest of a
longer line is read and dropped, and the line is reported as too long (with its number) so
that the caller counts it and goes on with the next one. Runs of blank lines are skipped by a
regular expression over the whole chunk, not one Python step per line (a 4 MB gzip of newlines
is 4 GiB of them).

A compressed stream is also watched as a whole: once more than `ratio_floor` bytes came out,
more than `max_ratio` bytes out per byte in stops the file (RatioExceeded). Text compresses
about 3-10x with gzip and rarely past 50x with zstd; a bomb compresses 1,000x (gzip's limit)
to millions of times (zstd).

Memory: one chunk, plus at most max_line_bytes of line (twice that while a line that spanned
chunks is joined), whatever the stream holds.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import IO

CHUNK_BYTES = 1 << 20
MAX_LINE_BYTES = 32 << 20   # a longer line is skipped ("line longer than 32 MiB")
MAX_RATIO = 200             # decompressed bytes per compressed byte, past RATIO_FLOOR_BYTES
RATIO_FLOOR_BYTES = 64 << 20  # a small file may decompress this much at any ratio

# What bytes.strip() strips: a line of only these is blank.
_NOT_BLANK = re.compile(rb"[^ \t\n\r\x0b\x0c]")


class RatioExceeded(Exception):  # noqa: N818 (a stop signal for the caller, not a bug)
    """The stream decompressed to more than max_ratio times the compressed bytes read."""


def size_name(nbytes: int) -> str:
    """33554432 -> '32 MiB', 1000 -> '1000 bytes': how a limit is named in a skip reason."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} bytes"


class BoundedLines:
    """Iterate (line number, bytes) for each non-blank line, 1-based, split at b"\\n", less its
    leading blanks; a line over `max_line_bytes` (counted from its first non-blank byte) comes
    as (number, None). `compressed_tell` (None for a plain file)
    says how many compressed bytes were consumed, for the ratio check. `decompressed` counts
    the bytes read from `stream`."""

    def __init__(self, stream: IO[bytes], compressed_tell: Callable[[], int] | None = None,
                 max_line_bytes: int = MAX_LINE_BYTES, max_ratio: float = MAX_RATIO,
                 ratio_floor: int = RATIO_FLOOR_BYTES, chunk_bytes: int = CHUNK_BYTES) -> None:
        self.stream = stream
        self.compressed_tell = compressed_tell
        self.max_line_bytes = max_line_bytes
        self.max_ratio = max_ratio
        self.ratio_floor = ratio_floor
        self.chunk_bytes = chunk_bytes
        self.decompressed = 0
        self.number = 0  # the line being read (for a caller reporting where the stream ended)

    def _read(self) -> bytes:
        # read1: what one step of the decompressor gives, so that a stream damaged further on
        # raises on the next call, not after losing the good bytes before the damage.
        chunk = self.stream.read1(self.chunk_bytes)
        self.decompressed += len(chunk)
        if (self.compressed_tell is not None and self.max_ratio
                and self.decompressed > self.ratio_floor
                and self.decompressed > self.max_ratio * max(self.compressed_tell(), 1)):
            raise RatioExceeded(f"decompressed over {self.max_ratio:g}x its size")
        return chunk

    def __iter__(self) -> Iterator[tuple[int, bytes | None]]:
        self.number = 1
        pending: list[bytes] = []  # the current line's pieces from earlier chunks
        held = 0                   # their bytes
        too_long = False           # the current line passed the limit: its rest is dropped
        while chunk := self._read():
            pos, size = 0, len(chunk)
            while pos < size:
                if not pending and not too_long:  # at a line's start: skip blank lines
                    found = _NOT_BLANK.search(chunk, pos)
                    if found is None:
                        self.number += chunk.count(b"\n", pos)
                        break
                    self.number += chunk.count(b"\n", pos, found.start())
                    pos = found.start()  # leading blanks are dropped (JSON ignores them)
                end = chunk.find(b"\n", pos)
                stop = size if end < 0 else end
                if not too_long:
                    if held + stop - pos > self.max_line_bytes:
                        too_long, pending, held = True, [], 0
                    elif end >= 0 and not pending:  # the whole line is in this chunk
                        line = chunk[pos:end]
                        if line.strip():
                            yield self.number, line
                        self.number += 1
                        pos = end + 1
                        continue
                    else:
                        pending.append(chunk[pos:stop])
                        held += stop - pos
                if end < 0:
                    break
                yield from self._finish(pending, too_long)
                pending, held, too_long = [], 0, False
                self.number += 1
                pos = end + 1
        yield from self._finish(pending, too_long)

    def _finish(self, pending: list[bytes], too_long: bool) -> Iterator[tuple[int, bytes | None]]:
        if too_long:
            yield self.number, None
        elif pending:
            line = b"".join(pending)
            pending.clear()  # the pieces are not held while the caller parses the line
            if line.strip():
                yield self.number, line
