"""sheepop's one process pool: tokenizer work (pre-split counting, encoding large texts) and
ingestion (extracting files, tokenizing documents) both run their workers through it.

Processes, not threads: pre-splitting, BPE merging, JSON parsing and HTML parsing are pure-Python
loops holding the GIL, and pdfium is not thread-safe. Work is handed out in order and results
come back in order, so the output never depends on the number of workers.

The workers are *spawned*, never forked, on every platform. A fork copies the parent's memory
but only the thread that called it: the parent of `sheepop train` holds torch's intra-op and
CUDA threads and tqdm's monitor thread, and a lock one of them held at the moment of the fork
stays locked forever in the child (a hang, not an error; Python 3.12 warns about forking a
multi-threaded process and 3.14 stopped using fork by default on Linux). Spawn starts a fresh
interpreter, which costs its imports (~0.2-1 s a worker): callers only start workers when the
work is large enough to pay for that, and run it in their own process otherwise.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

START_METHOD = "spawn"


def default_workers() -> int:
    """One worker per CPU this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def resolve_workers(workers: int) -> int:
    """`workers` if positive, else one per CPU."""
    return workers if workers > 0 else default_workers()


def batched(items: Iterable[str], target_chars: int) -> Iterator[list[str]]:
    """Consecutive texts grouped into lists of about `target_chars` characters."""
    batch: list[str] = []
    size = 0
    for item in items:
        batch.append(item)
        size += len(item)
        if size >= target_chars:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def imap_ordered(fn: Callable[[T], R], items: Iterable[T], workers: int,
                 initializer: Callable[..., Any] | None = None, initargs: tuple = (),
                 chunksize: int = 1) -> Iterator[R]:
    """fn over `items`, results in order as they come: in this process for one worker, else in
    `workers` spawned processes (each runs `initializer(*initargs)` once). Items are fed to the
    pool as it needs them, so a long stream of tasks is never all in memory."""
    if workers <= 1:
        if initializer is not None:
            initializer(*initargs)
        yield from map(fn, items)
        return
    with _signals_held():
        pool = mp.get_context(START_METHOD).Pool(workers, _worker_start, (initializer, initargs))
    with pool:
        yield from pool.imap(fn, items, chunksize=chunksize)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Ctrl-C, SIGTERM and SIGHUP recorded while a pool starts, then passed to the handler
    they had: raised while this process sends a new worker its start-up data, they left the
    worker reading half of it, and it printed a traceback ("EOFError: Ran out of input")
    under the parent's one line (measured: `prepare` interrupted 0.3 s after its start)."""
    names = ("SIGINT", "SIGTERM", "SIGHUP")
    signums = [getattr(signal, n) for n in names if hasattr(signal, n)]
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in signums}
    held = [s for s, h in previous.items() if callable(h)]  # not SIG_IGN, SIG_DFL
    got: list[int] = []
    for s in held:
        signal.signal(s, lambda signum, frame: got.append(signum))
    try:
        yield
    finally:
        for s in held:
            signal.signal(s, previous[s])
    if got:
        previous[got[0]](got[0], None)  # e.g. raises KeyboardInterrupt, now the pool exists


def _worker_start(initializer: Callable[..., Any] | None, initargs: tuple) -> None:
    """A worker ignores Ctrl-C: a terminal sends SIGINT to the whole process group, and the
    parent alone decides (it stops the pool and reports one line); a worker dying on it would
    print its own traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if initializer is not None:
        initializer(*initargs)


def map_ordered(fn: Callable[[T], R], items: Sequence[T], workers: int,
                initializer: Callable[..., Any] | None = None,
                initargs: tuple = ()) -> list[R]:
    """[fn(x) for x in items], spread over `workers` processes when that can help."""
    return list(imap_ordered(fn, items, min(workers, len(items)), initializer, initargs))


def share_work(fn: Callable[[T], R], items: Iterable[T], workers: int,
               here: Callable[[T], None], depth: int = 2) -> Iterator[R]:
    """Work shared by this process and `workers - 1` spawned ones, for a stream of items: an
    item goes to the pool while fewer than `depth` items per worker are waiting there (so no
    worker idles), otherwise this process handles it with `here`. Yields the pool's results,
    fn(item), as they come back (in submission order). At most `depth * (workers - 1)` items
    are in flight, so a long stream is never all in memory, and this process works instead of
    waiting (its own start-up costs nothing, where a worker's costs its imports)."""
    if workers <= 1:
        for item in items:
            here(item)
        return
    limit = depth * (workers - 1)
    with _signals_held():
        pool = mp.get_context(START_METHOD).Pool(workers - 1, _worker_start, (None, ()))
    with pool:
        pending: deque = deque()
        for item in items:
            while pending and pending[0].ready():
                yield pending.popleft().get()
            if len(pending) < limit:
                pending.append(pool.apply_async(fn, (item,)))
            else:
                here(item)
        while pending:
            yield pending.popleft().get()
