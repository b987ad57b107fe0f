"""Walk the inputs: folders recursively, include/exclude globs, hidden files, symlinks.

Folders are walked in sorted name order, so a run is reproducible. Symbolic links are followed,
but a folder already walked (a link back to an ancestor: a loop; or a second link to the same
place) is walked once, and a file reached twice (hard or symbolic links) is read once. Hidden
entries (names starting with ".") are skipped unless asked for; a path named on the command line
is always read, hidden or not.

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

from sheepop.data.ingest.record import FileRecord
from sheepop.errors import UserError


@dataclass
class Discovery:
    tasks: list[tuple[str, str]] = field(default_factory=list)  # (path to open, path shown)
    sizes: list[int] = field(default_factory=list)
    skipped: list[FileRecord] = field(default_factory=list)
    excluded: int = 0

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes)


def matches(rel: str, patterns: Iterable[str]) -> bool:
    name = rel.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatchcase(rel, p) or ("/" not in p and fnmatch.fnmatchcase(name, p))
               for p in patterns)


class _Walker:
    def __init__(self, include: Sequence[str], exclude: Sequence[str], hidden: bool,
                 avoid: Iterable[str | Path]) -> None:
        self.include, self.exclude, self.hidden = list(include), list(exclude), hidden
        self.avoid = {os.path.realpath(p) for p in avoid}
        self.out = Discovery()
        self._seen_files: dict[tuple[int, int], str] = {}
        self._seen_dirs: dict[tuple[int, int], str] = {}

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
        """Depth-first, sorted, following links; `ancestors` detects loops."""
        stack: list[tuple[str, str, str, frozenset]] = [(root, shown_root, "", frozenset())]
        while stack:
            folder, shown, rel, ancestors = stack.pop()
            try:
                st = os.stat(folder)
                key = (st.st_dev, st.st_ino)
                if os.path.realpath(folder) in self.avoid:
                    continue
                if key in ancestors:
                    self.skip(shown, "symlink loop", f"leads back to {self._seen_dirs[key]}")
                    continue
                if key in self._seen_dirs:
                    self.skip(shown, "folder already read", f"as {self._seen_dirs[key]}")
                    continue
                self._seen_dirs[key] = shown
                with os.scandir(folder) as it:
                    entries = sorted(it, key=lambda e: e.name)
            except OSError as e:
                self.skip(shown, "unreadable", e.strerror or str(e))
                continue
            below = ancestors | {key}
            subfolders = []
            for entry in entries:
                entry_rel = f"{rel}{entry.name}"
                entry_shown = os.path.join(shown, entry.name)
                if self.exclude and matches(entry_rel, self.exclude):
                    self.out.excluded += 1
                    continue
                if entry.name.startswith(".") and not self.hidden:
                    self.skip(entry_shown, "hidden")
                    continue
                try:
                    is_dir = entry.is_dir(follow_symlinks=True)
                    entry_stat = None if is_dir else entry.stat(follow_symlinks=True)
                except FileNotFoundError:
                    self.skip(entry_shown, "broken symlink")
                    continue
                except OSError as e:
                    self.skip(entry_shown, "unreadable", e.strerror or str(e))
                    continue
                if is_dir:
                    subfolders.append((entry.path, entry_shown, entry_rel + "/", below))
                elif self.include and not matches(entry_rel, self.include):
                    self.out.excluded += 1
                elif entry_stat is not None:
                    self.add_file(entry.path, entry_shown, entry_stat)
            stack.extend(reversed(subfolders))


def discover(inputs: Sequence[str | Path], include: Sequence[str] = (),
             exclude: Sequence[str] = (), hidden: bool = False,
             avoid: Iterable[str | Path] = ()) -> Discovery:
    """Every file to read under `inputs`, plus the entries skipped on the way.

    Raises UserError when an input does not exist. `avoid`: folders never entered (the output
    being written, when it sits inside an input).
    """
    walker = _Walker(include, exclude, hidden, avoid)
    for given in inputs:
        shown = str(given)
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
