"""The documents a run keeps: a few numbers each, never their text; exact duplicates dropped.

Per kept document: which store file holds it, its offset and length there, its file type, and
which file it came from (the index of that file's entry in the spooled records). Later stages
add its split and its token count: about 30 bytes a document in flat arrays, plus 12 to 48 in
the set of hashes seen (dedup, `DigestSet`), so a million JSON lines cost well under 100 MB, and
the text costs nothing.

Dedup: a document whose normalised text hashes like an earlier one is dropped. A whole-file
document that repeats an earlier one skips its file ("duplicate: same text as FIRST"); a line or
row that repeats one is counted in its file's skipped records as "duplicate".
"""

from __future__ import annotations

from array import array
from pathlib import Path

import numpy as np

from sheepop.data.ingest.record import MULTI_DOCUMENT, TYPES, USED, FileRecord


class DigestSet:
    """The 64-bit digests seen so far, each with the index of the file that held it first: an
    open-addressing hash table (linear probing) in two NumPy arrays, 12 bytes a slot, kept at
    most half full, instead of a dict's ~100 bytes an entry. 0 marks an empty slot, so a digest
    of 0 is stored as 1 (two texts colliding that way is as likely as any 64-bit collision)."""

    def __init__(self, capacity: int = 1 << 12):
        self.keys = np.zeros(capacity, dtype=np.int64)
        self.owners = np.zeros(capacity, dtype=np.int32)
        self.size = 0

    def first_owner(self, digest: int, owner: int) -> int:
        """The owner recorded for `digest`, or -1 after recording `owner` for it (new)."""
        if 2 * (self.size + 1) > len(self.keys):
            self._grow()
        key = digest or 1
        mask = len(self.keys) - 1
        slot = key & mask
        while True:
            found = int(self.keys[slot])
            if found == 0:
                self.keys[slot], self.owners[slot] = key, owner
                self.size += 1
                return -1
            if found == key:
                return int(self.owners[slot])
            slot = (slot + 1) & mask

    def _grow(self) -> None:
        used = np.flatnonzero(self.keys)
        keys, owners = self.keys[used], self.owners[used]
        self.__init__(2 * len(self.keys))
        for key, owner in zip(keys.tolist(), owners.tolist()):
            self.first_owner(key, owner)


class DocTable:
    def __init__(self) -> None:
        self.stores: list[str] = []
        self.store = array("H")
        self.offset = array("q")
        self.nbytes = array("q")
        self.type = array("b")
        self.val = np.zeros(0, dtype=bool)
        self.tokens = np.zeros(0, dtype=np.int64)
        self._seen = DigestSet()  # digest -> index in _paths of the file that held it first
        self._paths: list[str] = []

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
        self._paths.append(record.path)
        here = len(self._paths) - 1
        for offset, nbytes, digest, where, characters in zip(
                docs.offset, docs.nbytes, docs.digest, docs.where, docs.characters):
            earlier = self._seen.first_owner(digest, here)
            if earlier >= 0:
                if whole_file:
                    record.skip("duplicate", f"same text as {self._paths[earlier]}")
                    return first, first
                record.skipped_records.add("duplicate", where)
                dropped_chars += characters
                continue
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
