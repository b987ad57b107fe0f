"""`/v1/runs`: the training curves of run directories, for the page's runs view (docs/page.md).

    GET /v1/runs                       the runs: the served one, and every directory holding a
                                       metrics.jsonl under `sheepop serve --runs DIR` (two levels
                                       deep at most; symbolic links are not followed, neither a
                                       linked directory nor a linked metrics.jsonl)
    GET /v1/runs/{name}/metrics?since=N   the rows of its metrics.jsonl from row N on, and
                                       `total`, the rows found so far: polling with since=total
                                       reads only what a training run appended meanwhile

A row is what the trainer wrote (step, loss, lr, val_loss, val_bpb, ...); a line torn by a crash,
still being written, longer than MAX_LINE or nested deeper than json_out.MAX_NESTING (it could
not be sent) is skipped; a number that is not finite (a diverged loss) is sent as null. A
resumed run rewrites its file shorter: `since` past the end answers every row again with
`"reset": true`. A name is looked up among the listed runs, never joined
onto a path, so no request reads outside them.

Memory and time are bounded whatever the file's size: each file's rows are found once
(`MetricsIndex`: the byte span of each row, 12 bytes a row, not the rows) and each request reads
at most MAX_SCAN new bytes to find more and MAX_ANSWER bytes of rows to answer; `"more": true`
says that the answer stopped there, and the next poll goes on from `since + len(rows)`.
"""

from __future__ import annotations

import json
import os
import re
import stat
import threading
from array import array
from pathlib import Path
from typing import Any

import anyio
from starlette.requests import Request as HttpRequest
from starlette.routing import Route

from sheepop.serve.api.json_out import MAX_NESTING, FiniteJSONResponse, nesting
from sheepop.serve.api.protocol import ApiError, bad

METRICS = "metrics.jsonl"
MAX_DEPTH = 2
MAX_LINE = 1 << 16      # bytes of one row (a trainer's row is ~200): a longer line is skipped
MAX_SCAN = 8 << 20      # new bytes read per request to find rows
MAX_ANSWER = 4 << 20    # bytes of rows in one answer
MAX_FILES = 64          # metrics files whose index is kept


def is_regular(path: Path) -> bool:
    """Whether `path` is a regular file itself (a link to one is not)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def find_runs(served: Path | None, runs_dir: Path | None) -> dict[str, Path]:
    """name -> run directory: the served run (its directory's name) first, then the runs under
    `runs_dir` by their path relative to it."""
    found: dict[str, Path] = {}
    if served is not None:
        found[served.resolve().name] = served
    if runs_dir is None or not runs_dir.is_dir():
        return found
    served_at = () if served is None else (served.resolve(),)  # (listed once, first)
    level = [runs_dir]
    for _ in range(MAX_DEPTH):
        level = [child for folder in level for child in _folders_in(folder)]
        for child in level:
            if is_regular(child / METRICS) and child.resolve() not in served_at:
                found.setdefault(child.relative_to(runs_dir).as_posix(), child)
    return found


def _folders_in(folder: Path) -> list[Path]:
    """The folders directly in `folder`, by name, symbolic links left out (none if it cannot be
    read)."""
    try:
        return sorted(p for p in folder.iterdir() if p.is_dir() and not p.is_symlink())
    except OSError:
        return []


def _row(line: bytes) -> dict[str, Any] | None:
    """A line's row, or None: not JSON, not an object, no integer step, nested deeper than
    json_out.MAX_NESTING (it could not be sent)."""
    try:
        row = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(row, dict) or type(row.get("step")) is not int:
        return None
    return row if nesting(row) <= MAX_NESTING else None


class MetricsIndex:
    """Where each complete row of one metrics.jsonl lies (start, length), found once: a poll
    reads the bytes appended since the last one, at most MAX_SCAN of them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._reset(None)

    def _reset(self, file_id: tuple[int, int] | None) -> None:
        self.file_id = file_id
        self.starts, self.lengths = array("q"), array("l")
        self.scanned = 0          # bytes looked at (up to the end of the last whole line)
        self.skipping = False     # inside a line longer than MAX_SCAN
        self.last = b""           # the last row's bytes (a rewritten file changes them)

    def __len__(self) -> int:
        return len(self.starts)

    def _rewritten(self, fd: int, st: os.stat_result) -> bool:
        if (st.st_dev, st.st_ino) != self.file_id or st.st_size < self.scanned:
            return True
        return bool(self.last) and os.pread(fd, len(self.last),
                                            self.starts[-1]) != self.last

    def update(self, fd: int) -> bool:
        """Find the rows appended since the last call; whether the file's end was reached."""
        st = os.fstat(fd)
        if self._rewritten(fd, st):
            self._reset((st.st_dev, st.st_ino))
        data = os.pread(fd, min(MAX_SCAN, st.st_size - self.scanned), self.scanned)
        end = data.rfind(b"\n") + 1
        if end == 0:  # no whole line: still being written, or a part of a huge one
            if len(data) == MAX_SCAN:
                self.scanned += len(data)
                self.skipping = True
            return self.scanned >= st.st_size
        at = 0
        while at < end:
            stop = data.index(b"\n", at)
            line = data[at:stop]
            if self.skipping:
                self.skipping = False
            elif len(line) <= MAX_LINE and _row(line) is not None:
                self.starts.append(self.scanned + at)
                self.lengths.append(len(line))
                self.last = line
            at = stop + 1
        self.scanned += end
        return self.scanned >= st.st_size

    def rows(self, fd: int, since: int) -> list[dict[str, Any]]:
        """The rows from row `since` on, MAX_ANSWER bytes of them at most (one at least)."""
        if since >= len(self):
            return []
        first, last = since, since
        while last + 1 < len(self) and (self.starts[last + 1] + self.lengths[last + 1]
                                        - self.starts[first]) <= MAX_ANSWER:
            last += 1
        base = self.starts[first]
        data = os.pread(fd, self.starts[last] + self.lengths[last] - base, base)
        out = []
        for i in range(first, last + 1):
            row = _row(data[self.starts[i] - base:self.starts[i] - base + self.lengths[i]])
            if row is not None:  # (always: the file was checked unchanged)
                out.append(row)
        return out


def open_regular(path: Path) -> int | None:
    """A descriptor of `path` for reading if it is a regular file and not a link (a FIFO is
    not waited on), else None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


class MetricsFiles:
    """The index of each metrics.jsonl polled (the MAX_FILES last ones)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.indexes: dict[Path, MetricsIndex] = {}

    def _index(self, path: Path) -> MetricsIndex:
        with self.lock:
            index = self.indexes.pop(path, None) or MetricsIndex()
            self.indexes[path] = index  # (the most recent last)
            while len(self.indexes) > MAX_FILES:
                del self.indexes[next(iter(self.indexes))]
            return index

    def read(self, path: Path, since: int) -> tuple[int, list[dict[str, Any]], bool]:
        """(rows found so far, the rows from `since` on, whether more are left to send)."""
        fd = open_regular(path)
        if fd is None:
            return 0, [], False
        index = self._index(path)
        try:
            with index.lock:
                whole = index.update(fd)
                rows = index.rows(fd, since)
                return len(index), rows, not whole or since + len(rows) < len(index)
        finally:
            os.close(fd)


def _since(request: HttpRequest) -> int:
    raw = request.query_params.get("since", "0")
    if not re.fullmatch(r"[0-9]{1,18}", raw):
        raise bad("since", f"'since' must be a row number >= 0 (at most 18 digits), not "
                           f"{raw[:20]!r}")
    return int(raw)


def routes(served: Path | None, runs_dir: Path | None) -> list[Route]:
    """The two routes, over the served run and the runs under `runs_dir`."""
    files = MetricsFiles()

    async def list_runs(request: HttpRequest) -> FiniteJSONResponse:
        runs = await anyio.to_thread.run_sync(find_runs, served, runs_dir)
        data = [{"name": name, "served": i == 0 and served is not None,
                 "metrics": is_regular(path / METRICS)}
                for i, (name, path) in enumerate(runs.items())]
        return FiniteJSONResponse({"object": "list", "data": data})

    async def metrics(request: HttpRequest) -> FiniteJSONResponse:
        name, since = request.path_params["name"], _since(request)
        runs = await anyio.to_thread.run_sync(find_runs, served, runs_dir)
        if name not in runs:
            raise ApiError(404, f"no run named {name[:80]!r} here (GET /v1/runs lists them)",
                           param="name", code="run_not_found")
        reset = False
        total, rows, more = await anyio.to_thread.run_sync(files.read, runs[name] / METRICS,
                                                           since)
        if since > total:
            reset = True
            total, rows, more = await anyio.to_thread.run_sync(files.read,
                                                               runs[name] / METRICS, 0)
        return FiniteJSONResponse({"object": "metrics", "run": name, "total": total,
                                   "since": 0 if reset else since, "reset": reset,
                                   "more": more, "rows": rows})

    return [Route("/v1/runs", list_runs, methods=["GET"]),
            Route("/v1/runs/{name:path}/metrics", metrics, methods=["GET"])]
