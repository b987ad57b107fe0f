"""The shape a request asks its output to have: OpenAI's `response_format`, and `regex` (sheepop's
extension, as vLLM's guided_regex), read into a compiled constraint (sheepop.generation
.constraint) that every choice of the request follows with a state of its own.

    {"response_format": {"type": "text"}}                   nothing asked
    {"response_format": {"type": "json_object"}}            any JSON object
    {"response_format": {"type": "json_schema", "json_schema":
        {"name": "person", "schema": {...}, "strict": true}}}
    {"regex": "[0-9]{3}-[0-9]{4}"}

Anything that cannot be enforced exactly is refused, naming it, never dropped: a schema keyword
the constraint library does not enforce (uniqueItems, not, if/then/else, ...), `"strict": false`
(OpenAI's "best effort", which a mask cannot honour loosely), a schema that is not an object,
both fields at once, or `ignore_eos` (the end token is what closes a complete output).
"""

from __future__ import annotations

from typing import Any

from sheepop.files import shown
from sheepop.generation.constraint import (
    Constraint,
    ConstraintSpec,
    UnsupportedConstraint,
    compile_constraint,
)
from sheepop.tokenizers import Tokenizer

FORMATS = ("text", "json_object", "json_schema")


class FormatError(Exception):
    """A response format that is malformed or cannot be enforced (answered 400 on `param`)."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param, self.message = param, message


def _spec(body: dict) -> tuple[str, ConstraintSpec | None]:
    """(the field that asked, what it asked for), before compiling."""
    fmt, regex = body.get("response_format"), body.get("regex")
    if regex is not None:
        if not isinstance(regex, str) or not regex:
            raise FormatError("regex", f"'regex' must be a non-empty string, not {shown(regex)}")
        if fmt is not None and fmt != {"type": "text"}:
            raise FormatError("regex", "'regex' and 'response_format' cannot both be given")
        return "regex", ConstraintSpec("regex", regex)
    if fmt is None:
        return "response_format", None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind not in FORMATS:
        raise FormatError("response_format", f"'response_format' must be an object whose "
                          f"'type' is one of {', '.join(FORMATS)}, not {shown(fmt)}")
    if kind == "text":
        return "response_format", None
    if kind == "json_object":
        return "response_format", ConstraintSpec("json_object")
    return "response_format", ConstraintSpec("json_schema", _schema(fmt.get("json_schema")))


def _schema(given: Any) -> dict:
    """The schema of a json_schema format: {"name": ..., "schema": {...}, "strict": ...}."""
    if not isinstance(given, dict) or not isinstance(given.get("schema"), dict):
        raise FormatError("response_format", "'response_format.json_schema' must be an object "
                          f"with a 'schema' object, not {shown(given)}")
    name, strict = given.get("name"), given.get("strict")
    if name is not None and not isinstance(name, str):
        raise FormatError("response_format", f"'json_schema.name' must be a string, not "
                                             f"{shown(name)}")
    if strict is not None and strict is not True:
        raise FormatError("response_format", "'json_schema.strict' must be true (or absent): "
                          "this server enforces the whole schema or refuses it, never a part")
    return given["schema"]


def response_constraint(body: dict, tokenizer: Tokenizer, end_ids: frozenset[int]
                        ) -> Constraint | None:
    """The request's constraint compiled over the model's vocabulary (None: none asked), or
    FormatError. `end_ids`: the tokens that end its choices (none: refused)."""
    param, spec = _spec(body)
    if spec is None:
        return None
    if not end_ids:
        raise FormatError(param, f"'{param}' needs an end token to close a complete output: "
                                 "not with 'ignore_eos', nor with a model that has none")
    try:
        return compile_constraint(spec, tokenizer)
    except UnsupportedConstraint as e:
        raise FormatError(param, str(e)) from None
