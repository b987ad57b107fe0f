"""The output directory: built under a temporary name next to the target, renamed into place.

An interrupted run (Ctrl-C, an error, a kill) never leaves a half-written DATA_DIR: either the
previous one is still there untouched, or the new one is complete. `--overwrite` only ever
replaces a directory that `sheepop prepare` made (or an empty one), so a mistyped --out cannot
delete a user's folder. Temporary folders left by a killed run are removed by the next run.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from sheepop.data.shards import is_prepared_dir
from sheepop.errors import UserError


def _tmp_prefix(out: Path) -> str:
    return f".{out.name}.tmp-"


def check_target(out: Path, overwrite: bool) -> None:
    """Refuse an existing output unless --overwrite, and even then anything but a prepared
    (or empty) directory."""
    if not os.path.lexists(out):
        return
    if not overwrite:
        raise UserError(f"output {out} already exists (use --overwrite to replace it)")
    if out.is_dir() and (is_prepared_dir(out) or not any(out.iterdir())):
        return
    raise UserError(f"refusing to overwrite {out}: it is not a directory made by "
                    "`sheepop prepare` (choose another --out)")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale(out: Path) -> None:
    """Delete temporary folders of earlier runs for `out` whose process is gone."""
    if not out.parent.is_dir():
        return
    prefix = _tmp_prefix(out)
    for entry in out.parent.iterdir():
        if not entry.name.startswith(prefix):
            continue
        pid = entry.name[len(prefix):].split("-", 1)[0]
        if pid.isdigit() and not _pid_alive(int(pid)):
            shutil.rmtree(entry, ignore_errors=True)


def make_temp(out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{_tmp_prefix(out)}{os.getpid()}-", dir=out.parent))


def publish(tmp: Path, out: Path, overwrite: bool) -> None:
    """Rename the finished `tmp` to `out`, replacing an old output only now, at the end."""
    old = None
    if os.path.lexists(out):
        check_target(out, overwrite)  # the target may have appeared while we worked
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
        os.replace(out, old / out.name)
    os.replace(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
