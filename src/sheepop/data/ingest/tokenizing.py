"""Stored documents -> token ids, in worker processes, in document order.

The pipeline cuts the document list into tasks of about TASK_BYTES of text (several small
documents, or one piece of a large one, cut after a newline: see store.document_pieces); a
worker reads its task's text from the store, encodes it with the tokenizer it loaded once, puts
the EOS id after each document's last piece, and returns the ids as bytes in the output dtype.
Only addresses travel to the workers and only ids come back.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np

from sheepop.data.ingest.store import document_pieces
from sheepop.data.shards import numpy_dtype
from sheepop.tokenizers import Tokenizer, loads

TASK_BYTES = 4 << 20


@dataclass(frozen=True)
class Piece:
    store: str      # path of the store file
    offset: int
    nbytes: int
    doc: int        # index of the document (to count its tokens)
    last: bool      # the document's last piece: EOS follows it


_tokenizer: Tokenizer | None = None
_dtype = np.dtype("<u2")


def init_worker(tokenizer_json: str, dtype_name: str) -> None:
    global _tokenizer, _dtype
    _tokenizer = loads(tokenizer_json)
    _dtype = numpy_dtype(dtype_name)


def encode_task(task: Sequence[Piece]) -> tuple[bytes, list[tuple[int, int]], int, int]:
    """(ids as bytes, (document, ids) per piece, how many ids are <|unk|>, text bytes read)."""
    assert _tokenizer is not None, "init_worker was not called"
    unk = _tokenizer.unk_id
    arrays, counts, unknown = [], [], 0
    with ExitStack() as stack:  # each store opened once a task: a task may hold 1000s of lines
        opened: dict[str, BinaryIO] = {}
        for piece in task:
            if piece.store not in opened:
                opened[piece.store] = stack.enter_context(open(piece.store, "rb"))
            f = opened[piece.store]
            f.seek(piece.offset)
            text = f.read(piece.nbytes).decode("utf-8", "surrogatepass")
            ids = np.array(_tokenizer.encode(text, add_eos=piece.last), dtype=_dtype)
            if unk is not None:
                unknown += int(np.count_nonzero(ids == unk))
            arrays.append(ids)
            counts.append((piece.doc, int(ids.size)))
    data = np.concatenate(arrays).tobytes() if arrays else b""
    return data, counts, unknown, sum(piece.nbytes for piece in task)


def plan_tasks(docs: Iterator[tuple[str, int, int, int]],
               task_bytes: int = TASK_BYTES) -> Iterator[list[Piece]]:
    """Group (store path, offset, nbytes, doc index) documents into tasks of ~task_bytes."""
    task: list[Piece] = []
    size = 0
    for store, offset, nbytes, doc in docs:
        pieces = list(document_pieces(store, offset, nbytes, task_bytes)) \
            if nbytes > task_bytes else [(offset, nbytes)]
        for k, (off, n) in enumerate(pieces):
            if task and size + n > task_bytes:
                yield task
                task, size = [], 0
            task.append(Piece(store, off, n, doc, k == len(pieces) - 1))
            size += n
    if task:
        yield task
