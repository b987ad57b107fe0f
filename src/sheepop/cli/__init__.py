"""The `sheepop` command line: one entry point, one module per command.

Each module in `COMMAND_MODULES` has `register(subparsers)`, which adds its subcommand(s) with
`set_defaults(func=run)`. A `UserError` anywhere becomes one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from sheepop import __version__
from sheepop.errors import EXIT_USER_ERROR, UserError

COMMAND_MODULES = (
    "sheepop.cli.train",
    "sheepop.cli.generate",
    "sheepop.cli.eval",
    "sheepop.cli.progression",
    "sheepop.cli.prepare",
    "sheepop.cli.tokenizer",
    "sheepop.cli.export",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sheepop",
        description="A GPT-style language-model toolkit: prepare data, train, generate, evaluate.",
    )
    parser.add_argument("--version", action="version", version=f"sheepop {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USER_ERROR
    try:
        return int(args.func(args) or 0)
    except UserError as e:
        print(f"sheepop: error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    except BrokenPipeError:  # e.g. `sheepop generate ... | head`
        return 0
