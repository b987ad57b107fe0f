"""One writer per run directory: an exclusive lock on run_dir/train.lock.

The lock is `fcntl.flock` on an open file. The kernel holds it while that file is open in this
process and drops it when the process ends in any way (exit, exception, `kill -9`, a crash), so a
crash never leaves a stale lock; the file itself stays behind as a harmless note. The holder
writes who it is into the file (one JSON object: pid, host, command, start time) so that a
second writer's message names it:

    runs/r is in use by another training process (pid 4242 on host1, `sheepop train --out
    runs/r`, since 2025-01-01 10:00:00): wait for it to end or stop it, or choose another --out

The lock lives in sheepop.train, not the shared core: the trainer is the only process that
writes into a run directory again and again (`sheepop import` writes a new directory once), and
a lock is a process's concern, which the engine-neutral core has none of. Under torchrun only
rank 0 takes it (it alone writes). flock is advisory and local to one machine: two machines
writing into one shared (NFS) folder are not kept apart.

The file is opened without following a symbolic link (O_NOFOLLOW) and used only when it is a
regular file: a `train.lock` that links to a file outside the run would be truncated and
rewritten, one that links to /dev/zero or is a FIFO would be read without end (O_NONBLOCK keeps
the open itself from waiting for a FIFO's writer), and a hard link (`ln OUTSIDE run/train.lock`:
the file has two names) would have the holder's record written into OUTSIDE. Those are refused
with one line.
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import socket
import stat
import sys
import time
from pathlib import Path
from typing import IO

from sheepop.errors import UserError
from sheepop.files import check_one_name, check_own_entry

LOCK_FILE = "train.lock"


class RunLock:
    """A held lock; `release()` lets the next writer in (ending the process does too)."""

    def __init__(self, run_dir: Path, file: IO[str], created_dir: bool):
        self.run_dir, self._file, self._created_dir = run_dir, file, created_dir

    @property
    def held(self) -> bool:
        return not self._file.closed

    def release(self, undo: bool = False) -> None:
        """Let go. `undo`: this writer never wrote, so remove the directory it created (a failed
        start leaves nothing behind)."""
        if not self.held:
            return
        if undo and self._created_dir:
            # Still holding the lock: nobody else can be using the file or the directory.
            (self.run_dir / LOCK_FILE).unlink(missing_ok=True)
            try:
                self.run_dir.rmdir()
            except OSError:
                pass  # something else appeared in it: keep it
        self._file.close()


_FLAGS = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


def _open_lock(path: Path, flags: int, mode: str) -> IO[str]:
    """The lock file opened with `flags` (plus no link, no blocking), checked to be a regular
    file: one UserError line when it is a link or anything else (`files.check_own_entry`)."""
    check_own_entry(path)
    try:
        fd = os.open(path, flags | _FLAGS, 0o666)
    except OSError:
        check_own_entry(path)  # swapped for a link since the check: name it
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        check_own_entry(path)
        raise UserError(f"{path} is not a regular file, where the run keeps its own file")
    check_one_name(fd, path)  # a hard link: the holder's record would be written there too
    return os.fdopen(fd, mode, encoding="utf-8")


def _refuse(run_dir: Path, file: IO[str]) -> None:
    file.seek(0)
    holder = describe_holder(file.read())
    file.close()
    raise UserError(f"{run_dir} is in use by another training process ({holder}): wait for "
                    "it to end or stop it, or choose another --out")


def check_free(run_dir: str | Path) -> None:
    """Raise UserError naming the holder if a training process holds `run_dir`'s lock; else
    do nothing (creating nothing). A resume calls it before reading the run: the holder may be
    in the middle of replacing its checkpoint."""
    try:
        file = _open_lock(Path(run_dir) / LOCK_FILE, os.O_RDONLY, "r")
    except FileNotFoundError:
        return  # no lock file: nobody has trained there
    except OSError as e:
        raise UserError(f"cannot read {Path(run_dir) / LOCK_FILE}: {e.strerror}") from None
    try:
        fcntl.flock(file.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        _refuse(Path(run_dir), file)
    file.close()  # (closing lets go of the shared lock)


def acquire(run_dir: str | Path) -> RunLock:
    """Take `run_dir`'s lock (creating the directory), or raise UserError naming the holder."""
    run_dir = Path(run_dir)
    created = not run_dir.exists()
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        # (no truncation before holding it)
        file = _open_lock(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, "r+")
    except OSError as e:
        raise UserError(f"cannot use {run_dir} as a run directory: {e.strerror}") from None
    try:
        fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        _refuse(run_dir, file)
    file.seek(0)
    file.truncate()
    file.write(json.dumps(holder_record()) + "\n")
    file.flush()
    return RunLock(run_dir, file, created)


def holder_record() -> dict[str, object]:
    """Who holds the lock: this process."""
    program = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"
    if program == "__main__.py":  # started as `python -m sheepop`
        program = f"python -m {Path(sys.argv[0]).parent.name}"
    command = " ".join([program, shlex.join(sys.argv[1:])])
    return {"pid": os.getpid(), "host": socket.gethostname(), "command": command,
            "since": time.strftime("%Y-%m-%d %H:%M:%S"), "since_unix": round(time.time(), 3)}


def describe_holder(text: str) -> str:
    """One clause naming the holder from its record (what is legible of it)."""
    try:
        record = json.loads(text)
    except ValueError:
        record = None
    if not isinstance(record, dict):
        return "its record is not written yet"
    command = str(record.get("command", "?"))
    if len(command) > 160:
        command = command[:157] + "..."
    return (f"pid {record.get('pid', '?')} on {record.get('host', '?')}, `{command}`, "
            f"since {record.get('since', '?')}")
