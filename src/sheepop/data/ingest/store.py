"""A scratch store of normalised documents, so that no stage holds the corpus in memory.

Each extraction process appends the documents it extracts, as UTF-8, to its own file in the
output's temporary directory, and hands back only (file, offset, length, hash). The pipeline
later reads them back by that address to train the tokenizer and to tokenize. A document that
turns out to be unusable half-way (too many undecodable bytes, a corrupt last PDF page) is
rolled back by truncating the file to where it began.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

from sheepop.data.ingest.normalize import StreamNormalizer


class DocWriter:
    """Append documents to `path`: begin(), write(piece)..., then commit() or rollback()."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._f = open(self.path, "ab")  # noqa: SIM115 (lives as long as the worker)
        self._start = 0
        self._normalizer = StreamNormalizer()
        self._hash = hashlib.sha256()
        self.characters = 0
        self.has_text = False

    def begin(self) -> None:
        self._start = self._f.tell()
        self._normalizer = StreamNormalizer()
        self._hash = hashlib.sha256()
        self.characters = 0
        self.has_text = False

    def write(self, raw: str) -> None:
        """Normalise (NFC, "\\n" line endings) and append a piece of the current document."""
        self._append(self._normalizer.feed(raw))

    def _append(self, text: str) -> None:
        if not text:
            return
        data = text.encode("utf-8", "surrogatepass")
        self._f.write(data)
        self._hash.update(data)
        self.characters += len(text)
        if not self.has_text and not text.isspace():
            self.has_text = True

    def commit(self) -> tuple[int, int, str]:
        """Finish the document: (offset, length in bytes, SHA-256 hex of its bytes)."""
        self._append(self._normalizer.close())
        self._f.flush()  # other processes read the store while this one keeps writing
        return self._start, self._f.tell() - self._start, self._hash.hexdigest()

    def rollback(self) -> None:
        self._normalizer = StreamNormalizer()
        self._f.seek(self._start)
        self._f.truncate()

    def close(self) -> None:
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()


def read_document(path: str | Path, offset: int, nbytes: int) -> str:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(nbytes).decode("utf-8", "surrogatepass")


def document_pieces(path: str | Path, offset: int, nbytes: int,
                    piece_bytes: int) -> Iterator[tuple[int, int]]:
    """Cut a stored document into (offset, length) pieces of about `piece_bytes`, each ending
    after a newline when one is near (else on a character boundary), so that a huge document
    is tokenized piece by piece. Small documents are one piece."""
    end = offset + nbytes
    with open(path, "rb") as f:
        while end - offset > piece_bytes:
            f.seek(offset + piece_bytes)
            window = f.read(min(piece_bytes // 4 + 1, end - offset - piece_bytes))
            newline = window.find(b"\n")
            if newline >= 0:
                cut = offset + piece_bytes + newline + 1
            else:  # no newline near: move on to the start of the next UTF-8 character
                cut = offset + piece_bytes
                f.seek(cut)
                lead = f.read(4)
                k = 0
                while k < len(lead) and lead[k] & 0xC0 == 0x80:
                    k += 1
                cut += k
            if cut >= end:
                break
            yield offset, cut - offset
            offset = cut
    yield offset, end - offset
