"""The server's JSON out: always valid JSON, whatever the numbers.

Python's `json.dumps` writes NaN and Infinity as bare `NaN` and `Infinity`, which are not JSON (a
client's parser refuses the whole answer), and Starlette's JSONResponse raises on them instead
(a 500). A value the server sends may hold them when the model's own numbers are not finite (a
log-probability of a model whose weights overflow) or when a file it serves holds them (a
metrics.jsonl row written by a diverging run): such a number is sent as `null`.
"""

from __future__ import annotations

import json
import math
from typing import Any

from starlette.responses import JSONResponse


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
