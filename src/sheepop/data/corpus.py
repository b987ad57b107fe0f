"""The built-in default corpus: the Python standard library source of the running interpreter.

It exists wherever sheepop runs, needs no download, and is real text with structure a small
model can learn. Its files are read in sorted relative-path order (deterministic), one document
each, up to a byte cap. It is a fixed data set, not user input, so it keeps its own exact reader
(strict UTF-8, CRLF -> LF, nothing else): the default run's data stays byte for byte what it
was, whatever the ingestion readers (sheepop.data.ingest, used for every file or folder a user
gives) learn later. Measured on Python 3.11.7: through those readers, one stdlib file would
change (Unicode NFC in re/_casefix.py) and two would be dropped as duplicates.
"""

from __future__ import annotations

import os
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

from sheepop.errors import UserError
from sheepop.words import plural


@dataclass
class CorpusReport:
    root: str
    files_read: int = 0
    bytes_read: int = 0
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> count
    truncated: bool = False

    def summary(self) -> str:
        skipped = ", ".join(f"{n} {why}" for why, n in sorted(self.skipped.items())) or "none"
        cap = " (stopped at the size cap)" if self.truncated else ""
        return (f"read {plural(self.files_read, 'file')}, {self.bytes_read / 1e6:.2f} MB from "
                f"{self.root}{cap}; skipped: {skipped}")


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path | None = None) -> list[Path]:
    """The standard library's .py files, sorted; installed packages and tests excluded."""
    root = root or stdlib_root()
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        # Sort in place so the walk order (and so the corpus) is the same on every run.
        dirnames[:] = sorted(d for d in dirnames
                             if d not in ("site-packages", "dist-packages", "test", "tests",
                                          "idlelib", "__pycache__") and not d.startswith("."))
        files.extend(Path(dirpath) / f for f in sorted(filenames) if f.endswith(".py"))
    return files


def stdlib_texts(max_bytes: int) -> tuple[list[str], CorpusReport]:
    """The standard library's documents (one per file), up to `max_bytes`."""
    report = CorpusReport(str(stdlib_root()))
    texts: list[str] = []
    for f in stdlib_files():
        if report.bytes_read >= max_bytes:
            report.truncated = True
            break
        try:
            raw = f.read_bytes()
        except OSError:
            report.skipped["unreadable"] = report.skipped.get("unreadable", 0) + 1
            continue
        if not raw:
            report.skipped["empty"] = report.skipped.get("empty", 0) + 1
            continue
        if b"\x00" in raw[:8192]:
            report.skipped["binary"] = report.skipped.get("binary", 0) + 1
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            report.skipped["not UTF-8"] = report.skipped.get("not UTF-8", 0) + 1
            continue
        text = text.replace("\r\n", "\n")[: max_bytes - report.bytes_read]
        texts.append(text)
        report.files_read += 1
        report.bytes_read += len(text.encode("utf-8"))
    if not texts:
        raise UserError(f"no usable text found in {report.root}")
    return texts, report
