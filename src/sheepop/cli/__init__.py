"""The `sheepop` command line: one entry point, one module per command.

Each module in `COMMAND_MODULES` has `register(subparsers)`, which adds its subcommand(s) with
`set_defaults(func=run)`. A `UserError` anywhere becomes one line on stderr and exit status 2,
as does a mistake in the arguments (argparse: the usage of the command it belongs to, and the
near match of a misspelt option or choice, `common.Parser`).
Ctrl-C, SIGTERM and SIGHUP stop any command with one line on stderr and exit status 128 + the
signal's number (130, 143, 129), never a traceback; training saves its last finished step first
(sheepop.train.signals).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from sheepop import __version__
from sheepop.cli.common import APPLY_THREADS, SPARE_CORES, Parser
from sheepop.errors import EXIT_USER_ERROR, UserError

COMMAND_MODULES = (
    "sheepop.cli.train",
    "sheepop.cli.generate",
    "sheepop.cli.eval",
    "sheepop.cli.progression",
    "sheepop.cli.finetune",
    "sheepop.cli.chat",
    "sheepop.cli.prepare",
    "sheepop.cli.tokenizer",
    "sheepop.cli.export",
    "sheepop.cli.serve",
)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(  # its subcommands' parsers are Parsers too: mistakes name the near match
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
    from sheepop.train import signals  # the stdlib's signal module only: loads nothing heavy

    if getattr(args, APPLY_THREADS, False):  # inference commands: --threads, before any model
        from sheepop.threads import apply
        apply(args.threads, spare=getattr(args, SPARE_CORES, 0))

    try:
        with signals.raising_stop_signals():
            return int(args.func(args) or 0)
    except UserError as e:
        print(f"sheepop: error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt as e:  # Ctrl-C, SIGTERM or SIGHUP outside a training loop
        signum = signals.signum_of(e)
        print(f"sheepop: {signals.stopped_by(signum)}", file=sys.stderr)
        return signals.exit_status(signum)
    except BrokenPipeError:  # e.g. `sheepop generate ... | head`
        return 0
