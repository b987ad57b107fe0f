"""The budget of one chat-template rendering: its steps, its time and the size of what it makes.

A chat template is a program from a stranger (sheepop.tokenizers.chat_template). Jinja's sandbox
keeps it from Python's internals, not from running for ever or filling memory:
{% for i in range(100000) %}{% for j in range(100000) %}xxxxxxxxxx{% endfor %}{% endfor %} is
10^10 steps and 10^11 characters. So each rendering gets a `Budget`, which the template's own
operations spend (sheepop.tokenizers.template_bounds says how), and which stops the rendering
itself the moment it is spent: the checks run inside the rendering, so no thread is left running
it, and a server's other requests are answered meanwhile.

- steps: every iteration of a loop and every call (a macro, a method, a function, a filter),
  at most MAX_STEPS;
- time: looked at on every step, at most MAX_SECONDS;
- size: no value the template makes (a string, a list, what it has output so far, a macro's
  text) may hold more than `Budget.chars` characters: MAX_CHARS plus twice the conversation's
  own size. A list counts its items and, inside them, all of theirs (a list holding one list
  100,000 times prints 100,000 copies of it).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

import jinja2
from jinja2.utils import Namespace

MAX_STEPS = 2_000_000      # a real template takes a few per message
MAX_SECONDS = 5.0          # a real template takes milliseconds
MAX_CHARS = 4_000_000      # beyond the longest context any served model reads (~1M tokens)
MAX_INT_BITS = 4096        # a whole number a template computes (a real one counts messages)


class RenderLimit(jinja2.TemplateError):
    """The rendering spent its budget: the message says which bound."""


class Budget:
    """What one rendering may still spend (module docstring)."""

    def __init__(self, chars: int, steps: int | None = None, seconds: float | None = None):
        self.chars = chars
        self.steps = MAX_STEPS if steps is None else steps
        self.seconds = MAX_SECONDS if seconds is None else seconds
        self.steps_left, self.deadline = self.steps, time.monotonic() + self.seconds
        self.output = 0
        self._sizes: dict[int, tuple[Any, int]] = {}  # id -> (the value kept alive, its size)

    def step(self) -> None:
        self.steps_left -= 1
        if self.steps_left < 0:
            raise RenderLimit(f"it took more than {self.steps:,} steps (loop iterations and "
                              "calls)")
        if time.monotonic() > self.deadline:
            raise RenderLimit(f"it ran longer than {self.seconds:g} s")

    def allow(self, size: int) -> None:
        """Refuse a value of `size` characters before it is made."""
        if size > self.chars:
            raise RenderLimit(f"it made a value of more than {self.chars:,} characters")

    def emit(self, text: str) -> None:
        self.output += len(text)
        if self.output > self.chars:
            raise RenderLimit(f"its output passed {self.chars:,} characters")
        self.step()

    def checked(self, value: Any) -> Any:
        self.allow(self.size(value))
        return value

    def size(self, value: Any) -> int:
        """Characters `value` stands for: a string's length, a number's digits, a container's
        items and the sizes of each (shared ones counted every time they are held, as str()
        writes them), at most chars + 1; computed without recursion, once per container."""
        if not _is_container(value):
            return _scalar_size(value)
        limit, sizes = self.chars + 1, self._sizes
        stack, open_ = [value], set()
        while stack:
            obj = stack[-1]
            if id(obj) in sizes:
                stack.pop()
                continue
            items = _items(obj)
            if len(items) > limit:
                sizes[id(obj)] = (obj, limit)
                stack.pop()
                continue
            todo = [x for x in items if _is_container(x) and id(x) not in sizes
                    and id(x) not in open_]
            if todo and id(obj) not in open_:
                open_.add(id(obj))
                stack.extend(todo)
                continue
            total = len(items)  # (a container inside itself counts once more, as str() does)
            for x in items:
                total = min(limit, total + (sizes[id(x)][1] if id(x) in sizes else
                                            _scalar_size(x) if not _is_container(x) else 1))
            sizes[id(obj)] = (obj, total)
            open_.discard(id(obj))
            stack.pop()
        return sizes[id(value)][1]


_BUDGET: ContextVar[Budget | None] = ContextVar("chat_template_budget", default=None)


def _is_container(value: Any) -> bool:
    return isinstance(value, (list, tuple, dict, set, frozenset, Namespace))


def _items(value: Any) -> list[Any]:
    if isinstance(value, Namespace):
        value = value._Namespace__attrs  # type: ignore[attr-defined]
    if isinstance(value, dict):
        return [*value.keys(), *value.values()]
    return list(value)


def _scalar_size(value: Any) -> int:
    if isinstance(value, (str, bytes)):
        return len(value)
    if isinstance(value, int):
        if value.bit_length() <= 64:
            return len(str(value))
        return value.bit_length() // 3 + 1  # (at least its digits: log10(2) < 1/3)
    return 1


def budget_for(variables: Any) -> Budget:
    """The budget of a rendering of `variables` (the conversation and the rest): MAX_CHARS
    and twice their own size."""
    return Budget(MAX_CHARS + 2 * Budget(MAX_CHARS * 64).size(variables))


@contextlib.contextmanager
def spending(budget: Budget) -> Iterator[Budget]:
    """The block renders with `budget` (each thread and task its own: a ContextVar)."""
    token = _BUDGET.set(budget)
    try:
        yield budget
    finally:
        _BUDGET.reset(token)


def current() -> Budget | None:
    """The budget of the rendering under way in this thread or task (None: none)."""
    return _BUDGET.get()


def joined(pieces: Any) -> str:
    """Jinja's join of a macro's or a block's text, its size checked as it grows."""
    b = current()
    if b is None:
        return "".join(pieces)
    kept, total = [], 0
    for piece in pieces:
        total += len(piece)
        b.allow(total)
        kept.append(piece)
    return "".join(kept)
