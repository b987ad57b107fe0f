"""The server's JSON out: always valid JSON, whatever the numbers.

Python's `json.dumps` writes NaN and Infinity as bare `NaN` and `Infinity`, which are not JSON (a
client's parser refuses the whole answer), and Starlette's JSONResponse raises on them instead
(a 500). A value the server sends may hold them when the model's own numbers are not finite (a
log-probability of a model whose weights overflow) or when a file it serves holds them (a
metrics.jsonl row written by a diverging run): such a number is sent as `null`.

A value nested deeper than MAX_NESTING is never sent: Python's encoder recurses, and a value
nested ~1,000 deep raises RecursionError (a 500). A request body that deep is refused (400), a
file's row that deep skipped; `nesting` measures without recursing.
"""

from __future__ import annotations

import json
import math
from typing import Any

from starlette.responses import JSONResponse

MAX_NESTING = 32
"""Arrays and objects inside one another in a value received or sent: OpenAI's requests need
5, a metrics row 1."""


def nesting(value: Any) -> int:
    """How deep arrays and objects nest in a decoded JSON value (a scalar: 0), iteratively: a
    hostile value must not exhaust the stack of whatever walks it later; it stops counting past
    MAX_NESTING."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, (list, dict)):
            deepest = max(deepest, depth + 1)
            if deepest > MAX_NESTING:
                return deepest
            stack.extend((x, depth + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def finite(value: Any) -> Any:
    """`value` with every float that is not finite as None (lists, tuples, dicts walked)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def dumps(value: Any, compact: bool = False) -> bytes:
    """`value` as JSON bytes; a number that is not finite as null."""
    separators = (",", ":") if compact else None
    try:
        text = json.dumps(value, allow_nan=False, separators=separators)
    except ValueError:  # (rare: walk it only then)
        text = json.dumps(finite(value), allow_nan=False, separators=separators)
    return text.encode()


class FiniteJSONResponse(JSONResponse):
    """Starlette's JSONResponse, with a number that is not finite as null."""

    def render(self, content: Any) -> bytes:
        return dumps(content, compact=True)
