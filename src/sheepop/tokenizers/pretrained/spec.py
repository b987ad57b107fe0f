"""Reading one component of a Hugging Face tokenizer.json ({"type": "...", ...fields}).

Every part of the pretrained tokenizer (normalizer, pre-tokenizer, model, post-processor,
decoder) reads its fields through `Spec`, which refuses, by name, a field it does not know: a
newer `tokenizers` that adds a field changing ids gets a one-line refusal here instead of being
silently ignored. `Spec.done()` is where that check happens, after the part has read what it
honours.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import regex

from sheepop.errors import UserError
from sheepop.files import shown

_MISSING = object()


class Spec:
    """The fields of one component; `where` names it in messages ("tokenizer.json: normalizer")."""

    def __init__(self, data: Any, where: str) -> None:
        if not isinstance(data, dict) or not isinstance(data.get("type"), str):
            raise UserError(f"{where}: expected an object with a string 'type', got {shown(data)}")
        self.data, self.type, self._read = data, data["type"], {"type"}
        self.where = f"{where} ({self.type})"

    def get(self, key: str, kinds: type | tuple[type, ...], default: Any = _MISSING) -> Any:
        """Field `key`, which must be of `kinds` (None stands for the default when one is
        given: tokenizer.json writes absent options as null)."""
        self._read.add(key)
        value = self.data.get(key, _MISSING)
        if value is _MISSING or (value is None and default is not _MISSING):
            if default is _MISSING:
                raise self.error(f"the field '{key}' is missing")
            return default
        if isinstance(value, bool) and bool not in _as_tuple(kinds):
            raise self.error(f"'{key}' must be {_names(kinds)}, not {shown(value)}")
        if not isinstance(value, kinds):
            raise self.error(f"'{key}' must be {_names(kinds)}, not {shown(value)}")
        return value

    def ignore(self, *keys: str) -> None:
        """Fields that never change ids (offsets, cosmetic settings): read and left alone."""
        self._read.update(keys)

    def error(self, what: str) -> UserError:
        return UserError(f"{self.where}: {what}")

    def refuse(self, key: str, value: Any, why: str) -> UserError:
        return UserError(f"{self.where}: '{key}' = {shown(value)} is not supported ({why})")

    def done(self) -> None:
        """Refuse any field this component did not read: it might change the ids."""
        unknown = sorted(set(self.data) - self._read)
        if unknown:
            raise self.error(f"unknown field '{unknown[0]}' (sheepop refuses what it cannot "
                             "honour, since it may change the ids)")


def pattern_regex(spec: Spec, key: str = "pattern") -> regex.Pattern:
    """A `{"String": s}` or `{"Regex": r}` pattern as a compiled regex (a String is literal)."""
    pattern = spec.get(key, dict)
    if len(pattern) != 1 or not isinstance(next(iter(pattern.values())), str):
        raise spec.error(f"'{key}' must be {{\"String\": ...}} or {{\"Regex\": ...}}, "
                         f"not {shown(pattern)}")
    (kind, text), = pattern.items()
    if kind == "String":
        return regex.compile(regex.escape(text))
    if kind == "Regex":
        try:
            return regex.compile(text)
        except regex.error as e:
            raise spec.error(f"the regex {shown(text)} does not compile ({e})") from None
    raise spec.error(f"'{key}' must be a String or a Regex, not {kind!r}")


def one_char(spec: Spec, key: str) -> str:
    value = spec.get(key, str)
    if len(value) != 1:
        raise spec.error(f"'{key}' must be one character, not {shown(value)}")
    return value


def sequence(spec: Spec, key: str) -> list[Any]:
    items = spec.get(key, list)
    return list(items)


def _as_tuple(kinds: type | tuple[type, ...]) -> tuple[type, ...]:
    return kinds if isinstance(kinds, tuple) else (kinds,)


def _names(kinds: type | tuple[type, ...]) -> str:
    names: Iterable[str] = ({"str": "a string", "bool": "true or false", "int": "an integer",
                             "float": "a number", "list": "a list", "dict": "an object"}
                            .get(k.__name__, k.__name__) for k in _as_tuple(kinds))
    return " or ".join(names)
