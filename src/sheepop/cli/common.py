"""Pieces shared by the command modules: config options and loading a run."""

from __future__ import annotations

import argparse
from pathlib import Path

from sheepop import checkpoint
from sheepop.config import PRESETS, SECTIONS, Config, build_config


def add_config_options(p: argparse.ArgumentParser, default_preset: str | None = "tiny") -> None:
    p.add_argument("--preset", default=default_preset, metavar="NAME",
                   help=f"start from a preset: {', '.join(PRESETS)} (default: %(default)s)")
    p.add_argument("--config", metavar="FILE", help="a TOML file with [model], [train], [data], "
                   "[sample] tables, applied after the preset (default: none)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one config field, e.g. --set model.n_layer=4 (repeatable); "
                   "see --help-config for every key")
    p.add_argument("--help-config", action="store_true",
                   help="print every config key with its default and exit")


def run_config(run_dir: str | Path, overrides: list[str] | None = None,
               config_file: str | None = None) -> Config:
    """A run's saved config, then a TOML file, then `--set` overrides."""
    saved = checkpoint.load_config(run_dir)
    sections = {k: v for k, v in saved.items() if k in SECTIONS}
    cfg = Config.from_dict(sections, str(Path(run_dir) / checkpoint.CONFIG_FILE))
    return build_config(None, config_file, overrides, base=cfg)
