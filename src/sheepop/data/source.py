"""Which data a run trained on: a record saved with its checkpoints, checked on `--resume`.

The record (trainer.json's "data"):
    {"kind": "file" | "folder" | "prepared" | "builtin", "path": absolute DATA (or
     "builtin stdlib corpus"), "fingerprint": "sha256:...", "files": n, "bytes": total}

The fingerprint is cheap for any size of input: no byte of the data is read.
- file or folder: sha256 over the sorted (path relative to DATA, size, mtime_ns) of every
  regular file under it (symlinked files are followed, symlinked folders are not walked);
- prepared directory (`sheepop prepare`): sha256 of its meta.json, which names its shards;
- the built-in corpus: sha256 over the Python version and the same list for the standard
  library files it reads.
So an edit, a truncation, a new or removed file changes it; so does `touch` or a copy that does
not keep modification times (then give DATA explicitly: the run continues on it and says so).

On `--resume` without DATA the run continues on the data it recorded; if that data is gone or
its fingerprint changed, it stops with exit status 2 naming it. With DATA given, DATA is used; a
line says so when it differs from the record. A run saved before the record existed resumes on
the built-in corpus (the behaviour of those versions) with a warning that its data is unknown.
"""

from __future__ import annotations

import hashlib
import os
import stat
import sys
from pathlib import Path
from typing import Any

from sheepop.errors import UserError

BUILTIN = "builtin stdlib corpus"


def _walk_listing(root: Path) -> list[tuple[str, int, int]]:
    """(relative path, size, mtime_ns) of every regular file under root, sorted."""
    rows: list[tuple[str, int, int]] = []
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            full = os.path.join(dirpath, name)
            try:
                st = os.stat(full)
            except OSError:  # a broken link or a file removed meanwhile: not data
                continue
            if stat.S_ISREG(st.st_mode):
                rows.append((os.path.relpath(full, root), st.st_size, st.st_mtime_ns))
    return sorted(rows)


def _digest(parts: list[str], rows: list[tuple[str, int, int]]) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode("utf-8", "surrogateescape") + b"\0")
    for rel, size, mtime in rows:
        # surrogateescape: a file name that is not valid UTF-8 still hashes (to its bytes)
        h.update(f"{rel}\0{size}\0{mtime}\n".encode("utf-8", "surrogateescape"))
    return "sha256:" + h.hexdigest()


def describe(path: str | Path | None) -> dict[str, Any]:
    """The record of DATA `path` (None: the built-in standard-library corpus)."""
    if path is None:
        from sheepop.data.corpus import stdlib_files, stdlib_root

        root = stdlib_root()
        rows = []
        for f in stdlib_files(root):
            try:
                st = f.stat()
            except OSError:
                continue
            rows.append((str(f.relative_to(root)), st.st_size, st.st_mtime_ns))
        version = "python " + ".".join(map(str, sys.version_info[:3]))
        return {"kind": "builtin", "path": BUILTIN, "fingerprint": _digest([version], rows),
                "files": len(rows), "bytes": sum(r[1] for r in rows)}
    p = Path(path).absolute()
    if p.is_dir() and (p / "meta.json").is_file():
        meta = (p / "meta.json").read_bytes()
        return {"kind": "prepared", "path": str(p),
                "fingerprint": "sha256:" + hashlib.sha256(meta).hexdigest(),
                "files": 1, "bytes": len(meta)}
    if p.is_dir():
        kind, rows = "folder", _walk_listing(p)
    else:
        st = p.stat()
        kind, rows = "file", [(p.name, st.st_size, st.st_mtime_ns)]
    return {"kind": kind, "path": str(p), "fingerprint": _digest([], rows),
            "files": len(rows), "bytes": sum(r[1] for r in rows)}


def _same(record: dict[str, Any], path: str | Path | None) -> bool:
    now = describe(path)
    return now["path"] == record.get("path") and now["fingerprint"] == record.get("fingerprint")


def for_resume(given: str | None, recorded: dict[str, Any] | None, run_dir: str | Path,
               log=print) -> str | None:
    """The DATA a resumed run trains on (None: the built-in corpus); see the module docstring.

    `given` is the DATA of the command line, `recorded` the run's record (None for a run saved
    before runs recorded their data)."""
    if recorded is None:
        if given is None:
            log(f"warning: {run_dir} does not record which data it trained on (it was saved by "
                "an older sheepop): resuming on the built-in standard-library corpus; give DATA "
                "if it trained on other data")
        return given
    was = recorded.get("path", "?")
    if given is not None:
        if Path(given).exists() and not _same(recorded, given):
            now = str(Path(given).absolute())
            why = "which changed since" if now == was else f"not {now}"
            log(f"note: the run trained on {was} ({why}); continuing on {given} as asked")
        return given
    if recorded.get("kind") == "builtin":
        if not _same(recorded, None):
            log("note: the built-in standard-library corpus differs from the one the run "
                "trained on (another Python version?); continuing on this one")
        return None
    if not Path(was).exists():
        raise UserError(f"the run trained on {was}, which is gone: give DATA to continue on "
                        "other data")
    if not _same(recorded, was):
        raise UserError(f"the run trained on {was}, which changed since: give DATA to train on "
                        "it anyway")
    log(f"resuming on the data the run recorded: {was}")
    return was
