"""Raw text for `sheepop train DATA`: the documents of a file or folder, through the same
discovery, readers (encodings, HTML, PDF, OCR, JSON Lines, Parquet), dedup and process pool as
`sheepop prepare`, but held in memory and capped at `data.max_bytes` (a training run on raw text
is meant for corpora that fit; `prepare` streams any size to disk).

Files are extracted in walk order into a temporary store and read back in that order until the
cap; the document that crosses it is cut at max_bytes of UTF-8 (on a character boundary) and
only that much of it is read back. Extraction stops there too: a worker stops reading a file
(text, PDF, JSON Lines, Parquet...) after max_bytes of its text, so a 500 MB file costs what
the cap costs (docs/data.md: peak memory).
"""

from __future__ import annotations

import math
import os
import shlex
import tempfile
from collections import Counter
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path, PurePath

from sheepop.data.ingest import extract
from sheepop.data.ingest.discovery import discover
from sheepop.data.ingest.doctable import DocTable
from sheepop.data.ingest.record import USED, FileRecord, printable
from sheepop.data.ingest.report import Summary
from sheepop.data.ingest.store import read_document
from sheepop.errors import UserError
from sheepop.tokenizers.parallel import default_workers, imap_ordered
from sheepop.words import plural

# One worker per this much input, up to one per CPU: below it, starting a process costs more
# than it saves (tests and small folders run in this process).
BYTES_PER_WORKER = 32 << 20


@dataclass
class RawText:
    texts: list[str]
    summary: Summary
    root: str
    bytes_read: int = 0
    truncated: bool = False
    files_read: int = 0
    kinds: dict[str, Counter] = field(default_factory=dict)  # skip reason -> file kinds

    def add(self, record: FileRecord) -> None:
        """Count a file's record (and, when skipped, its kind under its reason)."""
        self.summary.add(record)
        if record.status != USED:
            self.kinds.setdefault(record.reason_code, Counter())[_kind(record.path)] += 1

    def lines(self) -> list[str]:
        """What the run log shows: one line of totals with the files skipped, by reason and
        kind (e.g. '2 unsupported type (.zip, .exe)'), then where lines/rows were skipped,
        then where `sheepop prepare` names each skipped file."""
        skipped = ", ".join(f"{n} {why} ({_kinds(self.kinds[why])})"
                            for why, n in self.summary.reasons.most_common())
        records = ", ".join(f"{n} {why}" for why, n in self.summary.record_reasons.most_common())
        if records:
            skipped = f"{skipped}; " if skipped else ""
            skipped += f"lines/rows: {records}"
        cap = " (stopped at the size cap)" if self.truncated else ""
        head = (f"read {plural(self.files_read, 'file')}, {plural(len(self.texts), 'document')}"
                f", {self.bytes_read / 1e6:.2f} MB from {self.root}{cap}; "
                f"skipped: {skipped or 'none'}")
        outside = self.summary.outside_lines()
        details = ([f"  to see each skipped file and why: sheepop prepare "
                    f"{shlex.quote(self.root)} --out DIR (its report and meta.json name them)"]
                   if skipped else [])
        return ([head] + [f"  {entry}" for entry in self.summary.record_files[:5]] + outside
                + details)


def _kind(path: str) -> str:
    """What kind of file a path names, for the skip counts: its extension ('.pdf'), a hidden
    name whole ('.git'), or 'no extension'."""
    name = PurePath(path).name
    suffix = PurePath(name.lstrip(".")).suffix.lower()
    return suffix or (name if name.startswith(".") else "no extension")


def _kinds(counts: Counter, shown: int = 4) -> str:
    """'.png' or '60 .png, 47 .jpg, ...': the kinds of the files skipped for one reason."""
    if len(counts) == 1:
        return next(iter(counts))
    parts = [f"{n} {kind}" for kind, n in counts.most_common(shown)]
    return ", ".join(parts) + (", ..." if len(counts) > shown else "")


def read_raw_text(path: str | Path, max_bytes: int, text_field: str = "text",
                  workers: int = 0, follow_links: bool = False) -> RawText:
    """The documents of the file or folder `path`, up to `max_bytes` of UTF-8 text.
    `workers` 0: one per 32 MB of input, at most one per CPU. `follow_links`: also read what
    symbolic links leading out of `path` point to (discovery.py)."""
    if not os.path.exists(path):
        raise UserError(f"data path not found: {printable(str(path))}")
    found = discover([path], follow_links=follow_links)
    if workers <= 0:
        workers = min(default_workers(), max(1, math.ceil(found.total_bytes / BYTES_PER_WORKER)))
    raw = RawText([], Summary(), printable(str(path)))
    for record in found.skipped:
        raw.add(record)
    options = extract.ExtractOptions(text_field=text_field, max_bytes=max_bytes)
    table = DocTable()
    with tempfile.TemporaryDirectory(prefix="sheepop-raw-") as tmp:
        results = imap_ordered(extract.extract_file, found.tasks, workers,
                               extract.init_worker, (tmp, options))
        try:
            with closing(results):  # leaving early ends the workers
                for record in results:
                    found.mark_outside(record)
                    first, end = table.add_file(record)
                    raw.add(record)
                    raw.files_read += end > first
                    if not _take(raw, table, Path(tmp), range(first, end), max_bytes):
                        break
        finally:
            extract.close_worker()  # the store of an in-process run (a no-op otherwise)
    if not raw.texts:
        raise UserError(raw.summary.nothing_usable(raw.root))
    return raw


def _take(raw: RawText, table: DocTable, tmp: Path, docs: range, max_bytes: int) -> bool:
    """Append the documents `docs` to raw.texts until max_bytes; False once the cap is hit."""
    for i in docs:
        if raw.bytes_read >= max_bytes:
            raw.truncated = True
            return False
        store, offset, nbytes = table.where(i, tmp)
        room = max_bytes - raw.bytes_read
        text = read_document(store, offset, nbytes, limit=room)
        if text:
            raw.texts.append(text)
            raw.bytes_read += len(text.encode("utf-8", "surrogatepass"))
        if nbytes > room:  # cut: the cap is reached
            raw.truncated = True
            return False
    return True
