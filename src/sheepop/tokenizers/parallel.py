"""Running tokenizer work in several processes (pre-split counting, encoding large corpora).

Python threads would not help: pre-splitting and BPE merging are pure-Python loops holding the
GIL. Each worker process receives its share of the text and returns plain lists / dicts.
Work is handed out in order and results come back in order, so the output never depends on
the number of workers.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")


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


def map_ordered(fn: Callable[[T], R], items: Sequence[T], workers: int,
                initializer: Callable[..., Any] | None = None,
                initargs: tuple = ()) -> list[R]:
    """[fn(x) for x in items], spread over `workers` processes when that can help."""
    workers = min(workers, len(items))
    if workers <= 1:
        if initializer is not None:
            initializer(*initargs)
        return [fn(x) for x in items]
    # fork starts in milliseconds and shares the parent's imports; elsewhere use the default.
    method = "fork" if "fork" in mp.get_all_start_methods() else None
    with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context(method),
                             initializer=initializer, initargs=initargs) as pool:
        return list(pool.map(fn, items))
