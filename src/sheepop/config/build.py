"""Where a configuration's values come from, applied in order: the defaults (or a saved run's
config), a preset (`sheepop.config.presets`), a TOML file, each `--set section.key=value`
string, and last the typed values of the command-line flags. Each value goes through `Config.set`,
so every source is converted and checked the same way (`sheepop.config.values`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from sheepop.config.presets import PRESETS
from sheepop.config.schema import RUN_SECTIONS, SECTIONS, Config
from sheepop.errors import UserError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib


def read_toml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"config file not found: {path}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"config file {path} is not valid TOML: {e}") from None


def build_config(preset: str | None = None, config_file: str | Path | None = None,
                 overrides: list[str] | None = None, base: Config | None = None,
                 values: dict[str, Any] | None = None,
                 only: tuple[str, ...] | None = None) -> Config:
    """Defaults (or `base`), then the preset, then the TOML file, then each `--set KEY=VALUE`
    string, then the typed `values` ({"train.steps": 100}: command-line flags), in order.
    With `only`, the file's other tables are skipped and `--set` refuses other sections;
    without it, the run's sections (a fine-tuning section is refused: `sheepop finetune`
    names its sections in `only`)."""
    cfg = base if base is not None else Config()
    settable = only if only is not None else tuple(RUN_SECTIONS)
    if preset is not None:
        if preset not in PRESETS:
            raise UserError(f"unknown preset '{preset}' (known: {', '.join(PRESETS)})")
        cfg.update(PRESETS[preset], f"preset {preset}")
    if config_file is not None:
        cfg.update(read_toml(config_file), str(config_file), only)
    for item in overrides or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise UserError(f"--set expects section.key=value, got '{item}'")
        _check_settable(key.strip(), settable, "--set")
        cfg.set(key.strip(), value.strip())
    for key, value in (values or {}).items():
        _check_settable(key, settable, "command line")
        cfg.set(key, value, "command line")
    return cfg


def _check_settable(dotted: str, sections: tuple[str, ...], where: str) -> None:
    """A known section outside `sections` is refused (an unknown one: by `Config.set`)."""
    section = dotted.partition(".")[0]
    if section in SECTIONS and section not in sections:
        raise UserError(f"{where} {dotted}: only {', '.join(sections)} settings can be set here")
