"""A user's config value as the type of its field: the one conversion every way of setting a
key goes through (a preset, a TOML file, `--set section.key=value`, a command-line flag)."""

from __future__ import annotations

import dataclasses
from typing import Any

from sheepop.errors import UserError
from sheepop.files import shown


def field_type(f: dataclasses.Field) -> type:
    """The Python type of a config field (int, float, bool or str)."""
    return f.type if isinstance(f.type, type) else {"int": int, "float": float, "bool": bool,
                                                    "str": str}[str(f.type)]


def convert_value(value: Any, f: dataclasses.Field, dotted: str, where: str) -> Any:
    """`value` as the field's type: a typed value (a flag's, a TOML file's) is checked, a string
    (`--set`) parsed; bools from true/false, yes/no, on/off, 1/0; ints also from 1e6 and
    1_000_000. One clear UserError otherwise."""
    kind = field_type(f)
    try:
        if kind is bool:
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if isinstance(value, bool) and kind is not str:  # True is an int to Python, not to us
            raise ValueError(value)
        if kind is int:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            if isinstance(value, str):
                value = value.replace("_", "")
                return int(float(value)) if "e" in value.lower() else int(value)
            return int(value)
        if kind is float:
            return float(value)
        if isinstance(value, (list, dict)):  # a table or array where text belongs
            raise ValueError(value)
        return str(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: float(10**400), int(1e400)
        raise UserError(f"{where}: {dotted} expects {kind.__name__}, got "
                        f"{shown(value)}") from None
