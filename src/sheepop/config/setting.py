"""A config field: a dataclass field that carries its help text and, for a choice, the allowed
values (read by `--help-config`, the command line's `choices=` and `Config.validate`)."""

from __future__ import annotations

from dataclasses import field
from typing import Any


def setting(default: Any, help: str, choices: tuple[str, ...] = (), many: bool = False,
       **kw: Any) -> Any:
    """A dataclass field that carries its help text and, for a choice, the allowed values
    (`{choices}` in the help is replaced by them, else they are appended); `many`: the value
    is a comma-separated list of them."""
    if choices:
        listed = " | ".join(choices)
        help = help.format(choices=listed) if "{choices}" in help else f"{help}: {listed}"
    meta = {"help": help, "choices": choices, "many": many}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta, **kw)
    return field(default=default, metadata=meta, **kw)
