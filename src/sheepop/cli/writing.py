"""A command's output written as one step the user can name: an OSError while writing it (a
full disk, a read-only folder, a lost mount) becomes one UserError line naming the output and
the system's reason, saying so when the disk is full, instead of a traceback."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from sheepop.checkpoint.commit import describe_os_error
from sheepop.errors import UserError


@contextlib.contextmanager
def writing(out: str | Path, what: str = "the output") -> Iterator[None]:
    """Run the block that writes `out`; an OSError in it is one UserError line."""
    try:
        yield
    except OSError as e:
        where = f" ({e.filename})" if e.filename and str(e.filename) != str(out) else ""
        raise UserError(f"cannot write {what} {out}{where}: {describe_os_error(e)}") from None


# A directory `--overwrite` may replace: one that holds a model (an export, a run), never any
# other folder a mistyped OUT could name.
MODEL_FILES = ("config.json", "model.safetensors")


def _first_missing(folder: Path) -> Path | None:
    """The highest of `folder` and the folders above it that does not exist: what
    `folder.mkdir(parents=True)` creates (None: `folder` exists)."""
    missing = None
    for p in (folder, *folder.parents):
        if os.path.lexists(p):
            break
        missing = p
    return missing


@contextlib.contextmanager
def undone_on_failure(folder: str | Path) -> Iterator[None]:
    """Run a block that may create `folder` (and the missing folders above it) and write into
    it; when the block fails, what it created goes: the folders it made, or the files it put in
    `folder` when `folder` was there and empty. A folder that held something is never touched
    (a failed export left an empty OUT behind)."""
    folder = Path(folder)
    missing = _first_missing(folder)
    was_empty = missing is None and folder.is_dir() and not any(folder.iterdir())
    try:
        yield
    except BaseException:
        if missing is not None:
            shutil.rmtree(missing, ignore_errors=True)
        elif was_empty:
            for entry in folder.iterdir():
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def replacing(out: str | Path, overwrite: bool) -> Iterator[None]:
    """Write the directory `out` in the block: a missing or empty `out` is written as it is
    (and what the block created removed when it fails: `undone_on_failure`); a non-empty one
    is refused without `overwrite`, and with it (a model directory only) moved aside first, so
    that no file of the old output stays beside the new one (a tokenizer.json the new export
    does not write), then deleted once the block succeeds, or put back when it fails."""
    out = Path(out)
    if not out.is_dir() or not any(out.iterdir()):
        with undone_on_failure(out):
            yield
        return
    held = sorted(p.name for p in out.iterdir())
    shown = ", ".join(held[:3]) + (", ..." if len(held) > 3 else "")
    if not overwrite:
        raise UserError(f"{out} is not empty (it holds {shown}): use --overwrite to replace "
                        "it, or choose another directory")
    if not any((out / name).is_file() for name in MODEL_FILES):
        raise UserError(f"refusing to overwrite {out}: it holds no model (no "
                        f"{' or '.join(MODEL_FILES)}), only {shown} (choose another directory)")
    aside = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
    os.replace(out, aside / out.name)
    try:
        yield
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        os.replace(aside / out.name, out)
        shutil.rmtree(aside, ignore_errors=True)
        raise
    shutil.rmtree(aside, ignore_errors=True)
