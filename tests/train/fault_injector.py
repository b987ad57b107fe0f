"""Make the k-th file operation of a block of code fail: the fault injector of the crash tests.

`Faults(at=k, action)` replaces the `os` functions that change files (open, write, writev,
fsync, replace, rename, unlink, mkdir, rmdir, close, chmod) with counting wrappers while the
block runs; operation number `at` (from 0) calls `action(name, args)` instead of the real
function: raise an OSError (an I/O error, or ENOSPC for a full disk), or `os._exit` (the
process dies there, as under `kill -9`: nothing after it runs, not even cleanup). `at=None`
only counts and logs, which gives the number of operations of one save and the index of its
commit.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from typing import Any

OPERATIONS = ("open", "write", "writev", "fsync", "replace", "rename", "unlink", "mkdir", "rmdir",
              "close", "chmod")


def raise_io_error(name: str, args: tuple) -> None:
    raise OSError(errno.EIO, f"injected I/O error in os.{name}")


def raise_disk_full(name: str, args: tuple) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def exit_now(name: str, args: tuple) -> None:
    os._exit(77)


class Faults:
    def __init__(self, at: int | None = None,
                 action: Callable[[str, tuple], None] = raise_io_error,
                 only: tuple[str, ...] = OPERATIONS):
        self.at, self.action, self.only = at, action, only
        self.log: list[tuple[str, tuple]] = []  # every operation seen: (name, args)
        self.fired = False
        self._saved: dict[str, Any] = {}

    def _wrap(self, name: str, real: Callable) -> Callable:
        def operation(*args, **kwargs):
            index = len(self.log)
            self.log.append((name, args))
            if index == self.at and name in self.only:
                self.fired = True
                self.action(name, args)
            return real(*args, **kwargs)
        return operation

    def __enter__(self) -> Faults:
        for name in OPERATIONS:
            self._saved[name] = getattr(os, name)
            setattr(os, name, self._wrap(name, self._saved[name]))
        return self

    def __exit__(self, *exc: object) -> None:
        for name, real in self._saved.items():
            setattr(os, name, real)

    def index_of(self, name: str, path_end: str) -> int:
        """The index of the first `name` operation whose last path argument ends with
        `path_end` (e.g. the rename that commits: "replace", "COMMIT.json")."""
        for i, (op, args) in enumerate(self.log):
            if op == name and args and str(args[-1]).endswith(path_end):
                return i
        raise LookupError(f"no os.{name} on *{path_end}")
