"""Pieces shared by the command modules: config options, flags that set config keys, and
loading a run's config."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from sheepop import checkpoint
from sheepop.config import PRESETS, Config, build_config, config_field
from sheepop.config_values import field_type

CONFIG_FLAGS = "config_flags"  # parser default: {dest: "section.key"} of the flags that set keys


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default, except None: such an option takes its value from the
    config (preset, file, --set, a run's config.json), which the help text names."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None:
            return action.help
        return super()._get_help_string(action)


def add_config_options(p: argparse.ArgumentParser, default_preset: str | None = "tiny") -> None:
    p.add_argument("--preset", default=default_preset, metavar="NAME",
                   help=f"start from a preset: {', '.join(PRESETS)} (default: %(default)s)")
    p.add_argument("--config", metavar="FILE", help="a TOML file with [model], [train], [data], "
                   "[sample] tables, applied after the preset (default: none)")
    add_set_option(p)
    p.add_argument("--help-config", action="store_true",
                   help="print every config key with its default and exit")


def add_set_option(p: argparse.ArgumentParser, example: str = "model.n_layer=4",
                   keys: str = "see --help-config for every key") -> None:
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help=f"override one config field, e.g. --set {example} (repeatable); {keys}")


def add_config_flag(p: argparse.ArgumentParser, flag: str, key: str, help: str | None = None,
                    note: str = "{key}", **kw: Any) -> None:
    """A flag that sets config key `key` (e.g. --steps for train.steps): its type and its
    choices are the field's, its help the field's unless given, followed by `note` ({key} and
    {default}: the field's default); not given, it sets nothing."""
    f = config_field(key)
    kind = field_type(f)
    if kind is bool:
        raise TypeError(f"{flag}: a bool config key needs a store_true flag, not a typed one")
    if f.metadata["choices"]:
        kw.setdefault("choices", f.metadata["choices"])
    action = p.add_argument(flag, type=kind, default=None,
                            help=f"{help or f.metadata['help']} "
                                 f"({note.format(key=key, default=f.default)})", **kw)
    p.set_defaults(**{CONFIG_FLAGS: {**(p.get_default(CONFIG_FLAGS) or {}), action.dest: key}})


def flag_values(args: argparse.Namespace) -> dict[str, Any]:
    """{"section.key": value} of the config flags given on the command line (typed values)."""
    return {key: getattr(args, dest) for dest, key in getattr(args, CONFIG_FLAGS, {}).items()
            if getattr(args, dest) is not None}


def run_config(run_dir: str | Path, overrides: list[str] | None = None,
               config_file: str | None = None, values: dict[str, Any] | None = None,
               only: tuple[str, ...] | None = None) -> Config:
    """A run's saved config, then a TOML file, then `--set` overrides, then typed flag values
    (`only`: the sections the file and `--set` may change)."""
    saved = checkpoint.load_config(run_dir)
    cfg = Config.from_saved(saved, str(Path(run_dir) / checkpoint.CONFIG_FILE))
    return build_config(None, config_file, overrides, base=cfg, values=values, only=only)
