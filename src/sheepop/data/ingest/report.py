"""The closing summary: files by type, used and skipped (with reasons), characters, tokens.

`Summary` is filled record by record while the run streams, so it never needs the list of
files; `to_dict()` goes into meta.json, `table()` is what the command prints. Lines and rows
of JSON Lines and Parquet files that gave no document are counted by reason, and the first
FILES_LISTED such files are listed with the first line/row numbers of each reason. Files
read through a symbolic link leading outside the inputs (--follow-links) are counted and the
first FILES_LISTED named with their real path.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from sheepop.data.ingest.record import TYPES, USED, FileRecord

_COLUMNS = ("files", "used", "skipped", "bytes", "characters", "tokens")
FILES_LISTED = 20


@dataclass
class Summary:
    by_type: dict[str, Counter] = field(
        default_factory=lambda: {t: Counter() for t in TYPES})
    reasons: Counter = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)  # reason code -> one file + detail
    excluded: int = 0
    record_reasons: Counter = field(default_factory=Counter)  # line/row skip reason -> count
    record_files: list[str] = field(default_factory=list)     # "path: what was skipped where"
    record_file_count: int = 0
    outside: list[str] = field(default_factory=list)  # "shown -> real path", first few
    outside_count: int = 0
    documents: int = 0
    train_documents: int = 0
    val_documents: int = 0
    train_tokens: int = 0
    val_tokens: int = 0
    unknown_tokens: int = 0
    pages: int = 0
    # Wall time of each stage: printed, kept out of meta.json so that a rerun on the same
    # input writes the same bytes.
    seconds: dict[str, float] = field(default_factory=dict)

    def add(self, record: FileRecord) -> None:
        row = self.by_type[record.type if record.type in self.by_type else "other"]
        row["files"] += 1
        row["bytes"] += record.bytes
        self.pages += record.pages or 0
        if record.status == USED:
            row["used"] += 1
            row["characters"] += record.characters
        else:
            row["skipped"] += 1
            self.reasons[record.reason_code] += 1
            self.examples.setdefault(record.reason_code, f"{record.path}: {record.reason}")
        if record.outside:
            self.outside_count += 1
            if len(self.outside) < FILES_LISTED:
                self.outside.append(f"{record.path} -> {record.outside}")
        skips = record.skipped_records
        if skips.total:
            self.record_reasons.update(skips.counts)
            self.record_file_count += 1
            if len(self.record_files) < FILES_LISTED:
                self.record_files.append(f"{record.path}: {skips.total:,} {record.unit}"
                                         f"{'s' if skips.total > 1 else ''} skipped: "
                                         f"{skips.describe(record.unit)}")

    def add_tokens(self, file_type: str, tokens: int) -> None:
        self.by_type[file_type]["tokens"] += tokens

    @property
    def used(self) -> int:
        return sum(row["used"] for row in self.by_type.values())

    def total(self, column: str) -> int:
        return sum(row[column] for row in self.by_type.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "files": self.total("files"), "used": self.used, "skipped": self.total("skipped"),
            "excluded": self.excluded, "bytes": self.total("bytes"),
            "characters": self.total("characters"), "tokens": self.total("tokens"),
            "documents": self.documents, "train_documents": self.train_documents,
            "val_documents": self.val_documents, "train_tokens": self.train_tokens,
            "val_tokens": self.val_tokens, "unknown_tokens": self.unknown_tokens,
            "pages": self.pages, "outside_files": self.outside_count,
            "by_type": {t: {c: row[c] for c in _COLUMNS}
                        for t, row in self.by_type.items() if row["files"]},
            "skipped_reasons": dict(self.reasons.most_common()),
            "skipped_records": dict(self.record_reasons.most_common()),
        }

    def nothing_usable(self, where: str) -> str:
        """The one line of a read that found no document, with why, as `sheepop prepare`,
        `train` and `eval` all say it: 'nothing usable found in chats.jsonl: 1 file (1 no
        documents; lines/rows: 1 no field 'text')'."""
        files = self.total("files")
        reasons = [", ".join(f"{n} {code}" for code, n in self.reasons.most_common(3))]
        records = ", ".join(f"{n:,} {why}" for why, n in self.record_reasons.most_common(3))
        if records:
            reasons.append(f"lines/rows: {records}")
        why = f" ({'; '.join(r for r in reasons if r)})" if any(reasons) else ""
        return f"nothing usable found in {where}: {files} file{'s' if files != 1 else ''}{why}"

    def outside_lines(self) -> list[str]:
        """Which files came from outside the inputs (through links, with --follow-links)."""
        if not self.outside_count:
            return []
        lines = [f"read through symbolic links from outside the inputs: "
                 f"{self.outside_count:,} file{'s' if self.outside_count > 1 else ''}"]
        lines.extend(f"  {entry}" for entry in self.outside)
        if self.outside_count > len(self.outside):
            lines.append(f"  ... and {self.outside_count - len(self.outside):,} more "
                         "(meta.json lists them all)")
        return lines

    def table(self) -> str:
        """The fixed-width table the command prints at the end."""
        header = f"{'type':<7}{'files':>8}{'used':>8}{'skipped':>9}{'MB':>10}" \
                 f"{'characters':>14}{'tokens':>14}"
        lines = [header, "-" * len(header)]

        def row_line(name: str, get) -> str:
            return (f"{name:<7}{get('files'):>8,}{get('used'):>8,}{get('skipped'):>9,}"
                    f"{get('bytes') / 1e6:>10,.1f}{get('characters'):>14,}{get('tokens'):>14,}")

        for t, row in self.by_type.items():
            if row["files"]:
                lines.append(row_line(t, row.__getitem__))
        lines.append("-" * len(header))
        lines.append(row_line("total", self.total))
        if self.reasons:
            lines.append("")
            lines.append("skipped:")
            for code, n in self.reasons.most_common():
                lines.append(f"  {n:>7,}  {code:<22} e.g. {self.examples[code]}")
        if self.excluded:
            lines.append(f"  {self.excluded:>7,}  excluded by --include/--exclude")
        if self.record_reasons:
            lines.append("")
            lines.append("skipped lines and rows (JSON Lines, Parquet):")
            for reason, n in self.record_reasons.most_common():
                lines.append(f"  {n:>7,}  {reason}")
            lines.extend(f"  {entry}" for entry in self.record_files)
            if self.record_file_count > len(self.record_files):
                lines.append(f"  ... and {self.record_file_count - len(self.record_files):,} "
                             "more files (meta.json lists them all)")
        if self.outside_count:
            lines.append("")
            lines.extend(self.outside_lines())
        return "\n".join(lines)
