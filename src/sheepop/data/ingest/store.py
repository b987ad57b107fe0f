"""A scratch store of normalised documents, so that no stage holds the corpus in memory.

Each extraction process appends the documents it extracts, as UTF-8, to its own file in the
output's temporary directory, and hands back only (file, offset, length, hash): the hash is the
first 8 bytes of BLAKE2b, signed (a collision between two of a million documents has odds of
about 3e-8), so that a million documents' hashes fit in 8 MB. The pipeline
later reads them back by that address to train the tokenizer and to tokenize. A document that
turns out to be unusable half-way (too many undecodable bytes, a corrupt last PDF page) is
rolled back by truncating the file to where it began.
"""

from __future__ import annotations

import codecs
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

from sheepop.data.ingest.normalize import StreamNormalizer, normalize_text


def _hasher():
    return hashlib.blake2b(digest_size=8)


class DocWriter:
    """Append documents to `path`: begin(), write(piece)..., then commit() or rollback()."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._f = open(self.path, "ab")  # noqa: SIM115 (lives as long as the worker)
        self._start = 0
        self._normalizer = StreamNormalizer()
        self._hash = _hasher()
        self.characters = 0
        self.has_text = False

    def begin(self) -> None:
        self._start = self._f.tell()
        self._normalizer = StreamNormalizer()
        self._hash = _hasher()
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

    def commit(self) -> tuple[int, int, int]:
        """Finish the document: (offset, length in bytes, 64-bit hash of its bytes)."""
        self._append(self._normalizer.close())
        digest = int.from_bytes(self._hash.digest(), "little", signed=True)
        return self._start, self._f.tell() - self._start, digest

    def add(self, text: str) -> tuple[int, int, int] | None:
        """One whole document at once (a JSON line, a Parquet row): normalised and committed;
        None (and nothing written) when it is empty or whitespace only."""
        self.begin()
        self._append(normalize_text(text))
        if not self.has_text:
            self.rollback()
            return None
        return self.commit()

    def flush(self) -> None:
        """Called after each file: the parent reads the store while this worker goes on."""
        self._f.flush()

    def tell(self) -> int:
        return self._f.tell()

    @property
    def written(self) -> int:
        """Bytes of the current document written so far."""
        return self._f.tell() - self._start

    def rollback(self, to: int | None = None) -> None:
        """Drop what was written since begin() (or since offset `to`: a whole file's
        documents)."""
        self._normalizer = StreamNormalizer()
        self._f.seek(self._start if to is None else to)
        self._f.truncate()

    def close(self) -> None:
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()


def read_document(path: str | Path, offset: int, nbytes: int, limit: int | None = None) -> str:
    """The stored document; with `limit`, only its first `limit` bytes (less the end of a
    character they would cut), so that a cap never reads the whole of a huge document."""
    with open(path, "rb") as f:
        f.seek(offset)
        if limit is None or limit >= nbytes:
            return f.read(nbytes).decode("utf-8", "surrogatepass")
        decoder = codecs.getincrementaldecoder("utf-8")("surrogatepass")
        return decoder.decode(f.read(max(limit, 0)), final=False)  # holds back a cut character


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
