"""Counting a corpus's pre-split words for BPE training, streamed and in several processes.

The counts are those of cutting out the special tokens and splitting each whole text at once,
but the text is never one list of words: it is cut at safe points (see pretokenize.py: where
each named pattern has a word boundary) into pieces of ~PIECE_CHARS characters, each split and
counted before the next. Memory then holds the counts and one piece's words, not the text's
millions of words. For a large text, jobs of JOB_CHARS go to worker processes while this one
counts too (parallel.share_work); counts add up the same in any order.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence

import regex

from sheepop.tokenizers.parallel import batched, resolve_workers, share_work
from sheepop.tokenizers.pretokenize import compiled, cuts_safely, iter_safe_chunks, split_text
from sheepop.tokenizers.special_matcher import SpecialMatcher

COUNT_PARALLEL_MIN_CHARS = 4 << 20
"""Below this much text, words are counted in this process only: a worker's start (~0.2 s of
imports on a quiet machine) is worth ~2 MB of counting, and the first jobs wait for it."""
PIECE_CHARS = 1 << 16
"""Text split into words at once: its list of words is all the counting holds besides counts."""
JOB_CHARS = 1 << 18
"""Text sent to a worker process at once (its counts come back per job): small, since the
jobs in flight are held twice (as text and pickled) until a worker takes them."""


def count_words(texts: Iterable[str], pattern: str, special_tokens: Sequence[str],
                workers: int = 1) -> Counter[str]:
    """How often each distinct pre-split word occurs (special tokens cut out first).

    Streamed: `texts` is read once, and each piece of at most ~PIECE_CHARS characters (cut
    where every named pattern has a word boundary) is split and counted before the next, so
    memory holds the counts and one piece's words, never a list of all the words. With
    `workers` > 1 (0: one per CPU) and more than COUNT_PARALLEL_MIN_CHARS of text, jobs go to
    `workers - 1` spawned processes while this one counts too; the counts are the same."""
    special_tokens = tuple(special_tokens)
    jobs = batched(_pieces(texts, pattern, special_tokens), JOB_CHARS)
    counts: Counter[str] = Counter()
    workers = resolve_workers(workers)
    regex_ = compiled(pattern)
    if workers > 1:  # worth starting processes only for a large text: look ahead that far
        head, size = [], 0
        for job in jobs:
            head.append(job)
            size += sum(map(len, job))
            if size >= COUNT_PARALLEL_MIN_CHARS:
                break
        jobs = itertools.chain(head, jobs)
        if size < COUNT_PARALLEL_MIN_CHARS:
            workers = 1
    for part in share_work(_count_job, ((job, pattern) for job in jobs), workers,
                           here=lambda job: _count_into(counts, job[0], regex_)):
        counts.update(part)
    return counts


def _pieces(texts: Iterable[str], pattern: str, special_tokens: Sequence[str]
            ) -> Iterator[str]:
    """The ordinary text of `texts` (special tokens cut out) in pieces that split into the
    same words as the whole: cut at safe points for a named pattern, whole otherwise."""
    splitter = SpecialMatcher({t: k for k, t in enumerate(special_tokens)})
    cut = cuts_safely(pattern, special_tokens)
    for text in texts:
        for piece, special in splitter.split(text):
            if special is None:
                yield from iter_safe_chunks(piece, PIECE_CHARS) if cut else (piece,)


def _count_into(counts: Counter[str], pieces: list[str], regex_: regex.Pattern) -> None:
    for piece in pieces:
        counts.update(split_text(regex_, piece))


def _count_job(job: tuple[list[str], str]) -> Counter[str]:
    """A worker's share: the word counts of one job's pieces."""
    pieces, pattern = job
    counts: Counter[str] = Counter()
    _count_into(counts, pieces, compiled(pattern))
    return counts
