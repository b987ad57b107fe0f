"""A command's output written as one step the user can name: an OSError while writing it (a
full disk, a read-only folder, a lost mount) becomes one UserError line naming the output and
the system's reason, saying so when the disk is full, instead of a traceback."""

from __future__ import annotations

import contextlib
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
