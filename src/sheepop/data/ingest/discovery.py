"""Walk the inputs: folders recursively, include/exclude globs, hidden files, symlinks.

Folders are walked in sorted name order, so a run is reproducible. Symbolic links that stay
inside the inputs are followed; a link that leads outside them (to /etc/passwd, to a home
folder) is skipped with its target, unless `follow_links` (--follow-links): then what it leads
to is read and each such file's record names its real path (`outside`). A folder already
walked (a link back to an ancestor: a loop; or a second link to the same place) is walked once,
and a file reached twice (hard or symbolic links) is read once. Hidden entries (names starting
with ".") are skipped unless asked for; a path named on the command line is always read,
hidden or not, wherever it leads.

Names are shown (and written to meta.json) through `printable`: a name that is not valid UTF-8
is read, and shown with its odd bytes as backslash escapes.

Globs use fnmatch rules on the path relative to the input folder, with "/" separators ("*"
also matches "/"); a pattern without "/" is also tried against the bare name. An excluded
folder is not entered. Excluded files are counted, not listed.
"""

from __future__ import annotations

import fnmatch
import os
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sheepop.data.ingest.record import FileRecord, printable
from sheepop.errors import UserError


@dataclass
class Discovery:
    tasks: list[tuple[str, str]] = field(default_factory=list)  # (path to open, path shown)
    sizes: list[int] = field(default_factory=list)
    skipped: list[FileRecord] = field(default_factory=list)
    excluded: int = 0
    outside: dict[str, str] = field(default_factory=dict)  # path shown -> real path, outside

    def mark_outside(self, record: FileRecord) -> FileRecord:
        """Set record.outside when the file came through a link leading out of the inputs."""
        record.outside = self.outside.get(record.path)
        return record

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes)


def matches(rel: str, patterns: Iterable[str]) -> bool:
    name = rel.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatchcase(rel, p) or ("/" not in p and fnmatch.fnmatchcase(name, p))
               for p in patterns)


class _Walker:
    def __init__(self, include: Sequence[str], exclude: Sequence[str], hidden: bool,
                 avoid: Iterable[str | Path], roots: Iterable[str | Path],
                 follow_links: bool) -> None:
        self.include, self.exclude, self.hidden = list(include), list(exclude), hidden
        self.avoid = {os.path.realpath(p) for p in avoid}
        self.roots = [os.path.join(os.path.realpath(r), "") for r in roots]  # with a final "/"
        self.follow_links = follow_links
        self.out = Discovery()
        self._seen_files: dict[tuple[int, int], str] = {}
        self._seen_dirs: dict[tuple[int, int], str] = {}

    def inside(self, real: str) -> bool:
        return any(os.path.join(real, "").startswith(root) for root in self.roots)

    def skip(self, shown: str, code: str, detail: str = "") -> None:
        self.out.skipped.append(FileRecord(path=shown).skip(code, detail))

    def add_file(self, path: str, shown: str, st: os.stat_result) -> None:
        if not stat.S_ISREG(st.st_mode):
            self.skip(shown, "not a regular file")
            return
        key = (st.st_dev, st.st_ino)
        first = self._seen_files.setdefault(key, shown)
        if first != shown:
            self.skip(shown, "same file as", first)
            return
        self.out.tasks.append((path, shown))
        self.out.sizes.append(st.st_size)

    def walk(self, root: str, shown_root: str) -> None:
        """Depth-first, sorted, following links; `ancestors` detects loops; `outside`: the
        folder was reached through a link leading out of the inputs."""
        stack: list[tuple[str, str, str, frozenset, bool]] = [
            (root, shown_root, "", frozenset(), False)]
        while stack:
            folder, shown, rel, ancestors, outside = stack.pop()
            opened = self._open(folder, shown, ancestors)
            if opened is None:
                continue
            key, real_folder, entries = opened
            below = ancestors | {key}
            subfolders = [sub for entry in entries
                          if (sub := self._entry(entry, rel, shown, real_folder, outside))]
            stack.extend((path, sub_shown, sub_rel, below, through_link)
                         for path, sub_shown, sub_rel, through_link in reversed(subfolders))

    def _open(self, folder: str, shown: str, ancestors: frozenset
              ) -> tuple[tuple[int, int], str, list[os.DirEntry]] | None:
        """The folder's (device, inode), real path and sorted entries; None (and the reason
        recorded) for a folder to avoid, a link back to an ancestor, one already read or one
        that cannot be read."""
        try:
            st = os.stat(folder)
            key = (st.st_dev, st.st_ino)
            real_folder = os.path.realpath(folder)
            if real_folder in self.avoid:
                return None
            if key in ancestors:
                self.skip(shown, "symlink loop", f"leads back to {self._seen_dirs[key]}")
                return None
            if key in self._seen_dirs:
                self.skip(shown, "folder already read", f"as {self._seen_dirs[key]}")
                return None
            self._seen_dirs[key] = shown
            with os.scandir(folder) as it:
                return key, real_folder, sorted(it, key=lambda e: e.name)
        except OSError as e:
            self.skip(shown, "unreadable", e.strerror or str(e))
            return None

    def _entry(self, entry: os.DirEntry, rel: str, shown: str, real_folder: str, outside: bool
               ) -> tuple[str, str, str, bool] | None:
        """Read one folder entry: a file is added (or skipped, with its reason); a folder is
        returned to walk, as (path, shown, rel, reached through a link out of the inputs)."""
        entry_rel = f"{rel}{entry.name}"
        entry_shown = os.path.join(shown, printable(entry.name))
        if self.exclude and matches(entry_rel, self.exclude):
            self.out.excluded += 1
            return None
        if entry.name.startswith(".") and not self.hidden:
            self.skip(entry_shown, "hidden")
            return None
        real = None  # where the entry really is, when that may be outside the inputs
        if outside or entry.is_symlink():
            real = os.path.realpath(os.path.join(real_folder, entry.name))
            if self.inside(real):
                real = None
            elif not self.follow_links:
                self.skip(entry_shown, "link outside the inputs",
                          f"to {printable(real)} (--follow-links reads it)")
                return None
        try:
            is_dir = entry.is_dir(follow_symlinks=True)
            entry_stat = None if is_dir else entry.stat(follow_symlinks=True)
        except FileNotFoundError:
            self.skip(entry_shown, "broken symlink")
            return None
        except OSError as e:
            self.skip(entry_shown, "unreadable", e.strerror or str(e))
            return None
        if is_dir:
            return entry.path, entry_shown, entry_rel + "/", real is not None
        if self.include and not matches(entry_rel, self.include):
            self.out.excluded += 1
        elif entry_stat is not None:
            self.add_file(entry.path, entry_shown, entry_stat)
            if real is not None:
                self.out.outside[entry_shown] = printable(real)
        return None


def discover(inputs: Sequence[str | Path], include: Sequence[str] = (),
             exclude: Sequence[str] = (), hidden: bool = False,
             avoid: Iterable[str | Path] = (), follow_links: bool = False) -> Discovery:
    """Every file to read under `inputs`, plus the entries skipped on the way.

    Raises UserError when an input does not exist. `avoid`: folders never entered (the output
    being written, when it sits inside an input). `follow_links`: also read what symbolic
    links leading outside the inputs point to (each such file is listed in `outside`).
    """
    walker = _Walker(include, exclude, hidden, avoid, inputs, follow_links)
    for given in inputs:
        shown = printable(str(given))
        if not os.path.lexists(given):
            raise UserError(f"input not found: {shown}")
        try:
            st = os.stat(given)
        except FileNotFoundError:
            raise UserError(f"input is a broken symbolic link: {shown}") from None
        except OSError as e:
            raise UserError(f"cannot read input {shown}: {e.strerror}") from None
        if stat.S_ISDIR(st.st_mode):
            walker.walk(str(given), shown)
        else:
            walker.add_file(str(given), shown, st)
    return walker.out
