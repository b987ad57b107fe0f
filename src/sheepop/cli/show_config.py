"""What `--help-config` and `--print-config` print: the configuration that will apply (after
the preset, the TOML file, `--set` and the flags), not the dataclasses' bare defaults.

`--help-config`: every key of the run's sections with the value that applies, its meaning, and
the bare default where the preset (or anything after it) changed it. `--print-config`: the same
values as a TOML file that `--config FILE` reads back to the same config."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from sheepop.config.schema import VERSION_KEY, Config


def _sections(cfg: Config) -> list[str]:
    """The run's sections, as its config.json holds them."""
    return [name for name in cfg.to_dict() if name != VERSION_KEY]


def _default(f: dataclasses.Field) -> Any:
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()


def describe_values(cfg: Config, origin: str, sections: tuple[str, ...] | None = None) -> str:
    """'[train]' then '  train.steps = 1500    # optimizer steps (default 1000; set by the
    tiny preset)' for each key of `sections` (default: the run's); `origin` names what set the
    values that differ."""
    lines = []
    for section in sections or _sections(cfg):
        values = getattr(cfg, section)
        lines.append(f"[{section}]")
        for f in dataclasses.fields(values):
            value, default = getattr(values, f.name), _default(f)
            changed = f" (default {default!r}; set by {origin})" if value != default else ""
            lines.append(f"  {section}.{f.name} = {value!r}    # {f.metadata['help']}{changed}")
    return "\n".join(lines)


def _toml_value(value: Any) -> str:
    """A TOML literal of a config value (bool, int, float, str or a list of them)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value) if value == value and abs(value) != float("inf") else (
            "nan" if value != value else ("inf" if value > 0 else "-inf"))
    if isinstance(value, (list, tuple)):
        return f"[{', '.join(_toml_value(v) for v in value)}]"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a TOML basic string is JSON's escapes
    return str(value)


def config_toml(cfg: Config) -> str:
    """The resolved config as TOML, one table per section (what `--config FILE` reads)."""
    parts = []
    for section in _sections(cfg):
        values = getattr(cfg, section)
        rows = [f"{f.name} = {_toml_value(getattr(values, f.name))}"
                for f in dataclasses.fields(values)]
        parts.append("\n".join([f"[{section}]", *rows]))
    return "\n\n".join(parts)
