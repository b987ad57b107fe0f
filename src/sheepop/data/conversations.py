"""Conversations for fine-tuning: JSON Lines in, (x, y) examples out, batches padded.

One conversation a line, in either of the two forms the ecosystem uses:

    {"messages": [{"role": "system" | "user" | "assistant", "content": "..."}, ...]}
    {"prompt": "...", "completion": "..."}      (= a user turn and the assistant's answer)

Each conversation becomes one example (x, y) through the tokenizer's chat template, sheepop's
or the model's own (sheepop.tokenizers.chat_format.encode_chat): x the ids, y the next token where
it counts in the loss (the assistant's tokens) and IGNORE_INDEX elsewhere. A line that gives no
example is skipped and recorded with its line number (1-based) and the reason: not valid JSON,
not a JSON object, neither form, an unknown role, missing or non-string content, an empty
conversation, a system message after the first, a special token's name inside a message, a
model's template refusing it (raise_exception), no assistant turn to learn from (with
train_on="assistant" nothing in it would count in the loss), or more tokens than the context
("does not fit the context of N tokens": cutting it would train on a turn without its end).
Blank lines are not conversations and are not counted. No usable line at all is an error.

Batches are padded, not packed: each row holds one conversation from its first token, then
padding (x = PAD_ID, y = IGNORE_INDEX) up to the longest row. Packing several conversations into
one window would waste no positions, but a causal model would let each conversation attend to
the ones before it in the window unless attention were masked block by block; conversations
here are short and similar in length, so padding costs little and keeps every example exactly
what generation will see: the conversation alone, from position 0. Right padding needs no
mask either: a real token never attends to a later position, and padded targets count in no
loss.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from sheepop.arch import IGNORE_INDEX, PAD_ID
from sheepop.data.ingest.jsonl import GZIP_MAGIC, ZSTD_MAGIC
from sheepop.errors import UserError
from sheepop.files import open_regular
from sheepop.tokenizers import Tokenizer
from sheepop.tokenizers.chat_format import encode_chat, message_problem, require_chat_tokens

Example = tuple[np.ndarray, np.ndarray]

MAX_FILE_BYTES = 8 * 2**30
MAX_LINE_BYTES = 16 * 2**20
"""A longer line is skipped unread: no context holds that many tokens."""
SHOWN_LINES = 5  # line numbers the report lists per reason


@dataclass
class ChatData:
    """The examples of a conversations file, and the lines that gave none."""

    path: str
    examples: list[Example] = field(default_factory=list)
    skipped: list[tuple[int, str]] = field(default_factory=list)  # (line number, reason)
    lines: int = 0  # non-blank lines read

    def report(self) -> list[str]:
        """Lines for the log: what was used, then each reason for skipping, with where."""
        out = [f"conversations: {len(self.examples):,} of {self.lines:,} lines of {self.path}"
               + (f" ({len(self.skipped):,} skipped)" if self.skipped else "")]
        for reason, numbers in _by_reason(self.skipped).items():
            shown = ", ".join(map(str, numbers[:SHOWN_LINES]))
            more = f", ... ({len(numbers):,} lines)" if len(numbers) > SHOWN_LINES else ""
            out.append(f"  skipped: {reason}: line{'s' if len(numbers) > 1 else ''} "
                       f"{shown}{more}")
        return out


def _by_reason(skipped: Sequence[tuple[int, str]]) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = defaultdict(list)
    for number, reason in skipped:
        groups[reason].append(number)
    return dict(groups)


def conversation_of(obj: Any) -> tuple[list[Any] | None, str | None]:
    """(messages, None) for a line's JSON value, or (None, why it holds no conversation)."""
    if not isinstance(obj, dict):
        return None, "not a JSON object"
    simple = "prompt" in obj or "completion" in obj
    if "messages" in obj:
        if simple:
            return None, "both 'messages' and 'prompt'/'completion'"
        messages = obj["messages"]
    elif simple:
        for key in ("prompt", "completion"):
            if not isinstance(obj.get(key), str):
                return None, f"'{key}' {'missing' if key not in obj else 'not a string'}"
        messages = [{"role": "user", "content": obj["prompt"]},
                    {"role": "assistant", "content": obj["completion"]}]
    else:
        return None, "neither 'messages' nor 'prompt' and 'completion'"
    problem = message_problem(messages)
    return (None, problem) if problem else (messages, None)


def example_of(line: bytes, tokenizer: Tokenizer, block_size: int, train_on: str
               ) -> tuple[Example | None, str | None]:
    """(example, None) for one line of the file, or (None, why it gives none)."""
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):  # ValueError: also bytes that are not UTF-8
        return None, "not valid JSON"
    messages, problem = conversation_of(obj)
    if messages is None:
        return None, problem
    try:
        x, y = encode_chat(tokenizer, messages, train_on=train_on)
    except UserError as e:  # a special token's name in a message
        return None, str(e)
    if len(x) > block_size:
        return None, f"does not fit the context of {block_size} tokens"
    if not (y != IGNORE_INDEX).any():
        return None, "no assistant turn to learn from"
    return (x, y), None


def _lines(f: IO[bytes]) -> Iterator[bytes | None]:
    """The file's lines; None for a line longer than MAX_LINE_BYTES (read past, not kept)."""
    while True:
        line = f.readline(MAX_LINE_BYTES + 1)
        if not line:
            return
        if len(line) <= MAX_LINE_BYTES:
            yield line
            continue
        while line and not line.endswith(b"\n"):
            line = f.readline(MAX_LINE_BYTES)
        yield None


def read_conversations(path: str | Path, tokenizer: Tokenizer, block_size: int,
                       train_on: str = "assistant") -> ChatData:
    """Every usable conversation of the JSON Lines file at `path` as an (x, y) example of at
    most `block_size` positions (see the module docstring); UserError when none is usable."""
    require_chat_tokens(tokenizer, "the tokenizer")
    data = ChatData(str(path))
    with open_regular(path, what="conversations file", limit=MAX_FILE_BYTES) as f:
        head = f.peek(4)[:4]  # type: ignore[attr-defined]
        if head.startswith(GZIP_MAGIC) or head.startswith(ZSTD_MAGIC):
            raise UserError(f"{path} is compressed: decompress it to plain JSON Lines first")
        for number, line in enumerate(_lines(f), 1):
            if line is not None and not line.strip():
                continue
            data.lines += 1
            if line is None:
                example, reason = None, f"longer than {MAX_LINE_BYTES:,} bytes"
            else:
                example, reason = example_of(line, tokenizer, block_size, train_on)
            if example is None:
                data.skipped.append((number, str(reason)))
            else:
                data.examples.append(example)
    if not data.examples:
        reasons = "; ".join(f"{r} ({len(n)})" for r, n in _by_reason(data.skipped).items())
        raise UserError(f"{path}: no usable conversation in {data.lines} line"
                        f"{'s' if data.lines != 1 else ''}" + (f" ({reasons})" if reasons
                                                              else ""))
    return data


def pad_examples(examples: Sequence[Example], length: int | None = None,
                 pad_id: int = PAD_ID) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) of shape (B, T), T = `length` or the longest example: each example from
    position 0, then x = pad_id and y = IGNORE_INDEX."""
    T = max(len(x) for x, _ in examples) if length is None else length
    x_out = np.full((len(examples), T), pad_id, dtype=np.int64)
    y_out = np.full((len(examples), T), IGNORE_INDEX, dtype=np.int64)
    for b, (x, y) in enumerate(examples):
        if len(x) > T:
            raise ValueError(f"an example of {len(x)} positions does not fit {T}")
        x_out[b, :len(x)] = x
        y_out[b, :len(y)] = y
    return x_out, y_out


def chat_batches(examples: Sequence[Example], batch_size: int, rng: np.random.Generator,
                 pad_id: int = PAD_ID) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """One epoch: every example once, in the order of `rng.permutation`, `batch_size` at a
    time (the last batch may be smaller), each batch padded to its longest example."""
    order = rng.permutation(len(examples))
    for start in range(0, len(order), batch_size):
        yield pad_examples([examples[i] for i in order[start:start + batch_size]],
                           pad_id=pad_id)
