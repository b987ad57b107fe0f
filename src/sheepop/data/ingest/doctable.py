"""The documents a run keeps: a few numbers each, never their text; exact duplicates dropped.

Per kept document: which store file holds it, its offset and length there, its file type, and
which file it came from (the index of that file's entry in the spooled records). Later stages
add its split and its token count. About 40 bytes a document in flat arrays, plus ~100 bytes in
the dictionary of hashes seen (dedup), so a million JSON lines cost ~140 MB at most, and the
text costs nothing.

Dedup: a document whose normalised text hashes like an earlier one is dropped. A whole-file
document that repeats an earlier one skips its file ("duplicate: same text as FIRST"); a line or
row that repeats one is counted in its file's skipped records as "duplicate".
"""

from __future__ import annotations

from array import array
from pathlib import Path

import numpy as np

from sheepop.data.ingest.record import MULTI_DOCUMENT, TYPES, USED, FileRecord


class DocTable:
    def __init__(self) -> None:
        self.stores: list[str] = []
        self.store = array("H")
        self.offset = array("q")
        self.nbytes = array("q")
        self.type = array("b")
        self.val = np.zeros(0, dtype=bool)
        self.tokens = np.zeros(0, dtype=np.int64)
        self._seen: dict[int, str] = {}  # hash -> path of the file that held it first

    def __len__(self) -> int:
        return len(self.offset)

    def add_file(self, record: FileRecord) -> tuple[int, int]:
        """Keep `record`'s documents that were not seen before, updating the record (skipped
        when nothing is left); the range [first, end) of the kept ones in the table."""
        first = len(self)
        if record.status != USED:
            return first, first
        docs, whole_file = record.docs, record.type not in MULTI_DOCUMENT
        store = self._store_index(record.store or "")
        kind = TYPES.index(record.type)
        dropped_chars = 0
        for offset, nbytes, digest, where, characters in zip(
                docs.offset, docs.nbytes, docs.digest, docs.where, docs.characters):
            earlier = self._seen.get(digest)
            if earlier is not None:
                if whole_file:
                    record.skip("duplicate", f"same text as {earlier}")
                    return first, first
                record.skipped_records.add("duplicate", where)
                dropped_chars += characters
                continue
            self._seen[digest] = record.path
            self.store.append(store)
            self.offset.append(offset)
            self.nbytes.append(nbytes)
            self.type.append(kind)
        kept = len(self) - first
        if not kept:
            record.skip("duplicate", f"all {len(docs):,} documents seen before")
        else:
            record.documents, record.characters = kept, record.characters - dropped_chars
        return first, len(self)

    def _store_index(self, name: str) -> int:
        if name not in self.stores:
            self.stores.append(name)
        return self.stores.index(name)

    def where(self, i: int, root: Path) -> tuple[str, int, int]:
        return str(root / self.stores[self.store[i]]), self.offset[i], self.nbytes[i]

    def total_bytes(self, rows: np.ndarray | None = None) -> int:
        nbytes = np.frombuffer(self.nbytes, dtype=np.int64) if len(self) else \
            np.zeros(0, np.int64)
        return int(nbytes.sum() if rows is None else nbytes[rows].sum())

    def tokens_by_type(self) -> dict[str, int]:
        kinds = np.frombuffer(self.type, dtype=np.int8) if len(self) else np.zeros(0, np.int8)
        sums = np.bincount(kinds, weights=self.tokens, minlength=len(TYPES))
        return {t: int(sums[k]) for k, t in enumerate(TYPES) if sums[k]}
