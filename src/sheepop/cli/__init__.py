"""The `sheepop` command line: one entry point, one module per command.

Each module in `COMMAND_MODULES` has `register(subparsers)`, which adds its subcommand(s) with
`set_defaults(func=run)`. A `UserError` anywhere becomes one line on stderr and exit status 2,
as does a mistake in the arguments (argparse: the usage of the command it belongs to, and the
near match of a misspelt option or choice, `common.Parser`).
Ctrl-C, SIGTERM and SIGHUP stop any command with one line on stderr and exit status 128 + the
signal's number (130, 143, 129), never a traceback; training saves its last finished step first
(sheepop.train.signals).

The first moments count too: the program starts in `sheepop.__main__.main`, whose first line
makes the three signals print one line and exit at once; `main` (called there with
`as_program=True`) replaces that with raising handlers inside its `try`, which covers the
commands' imports and the parser. A signal inherited as ignored stays ignored.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import threading

from sheepop import __version__
from sheepop.cli.common import APPLY_THREADS, SPARE_CORES, Parser
from sheepop.errors import EXIT_USER_ERROR, UserError

COMMAND_MODULES = (
    "sheepop.cli.train",
    "sheepop.cli.generate",
    "sheepop.cli.eval",
    "sheepop.cli.progression",
    "sheepop.cli.finetune",
    "sheepop.cli.rl",
    "sheepop.cli.chat",
    "sheepop.cli.steer",
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


def main(argv: list[str] | None = None, as_program: bool = False) -> int:
    """Run the command of `argv` (sys.argv's by default); its exit status. `as_program`: called
    by the program's entry point (sheepop.__main__), whose start-up handlers Ctrl-C's raising
    one replaces (a test or a library calling `main` keeps its own SIGINT handler)."""
    from sheepop.train import signals  # the stdlib's signal module only: loads nothing heavy

    try:
        if as_program:
            _raise_on_ctrl_c()
        with signals.raising_stop_signals():
            parser = build_parser()
            args = parser.parse_args(argv)
            if not getattr(args, "func", None):
                parser.print_help()
                return EXIT_USER_ERROR
            if getattr(args, APPLY_THREADS, False):  # inference: --threads, before any model
                from sheepop.threads import apply
                apply(args.threads, spare=getattr(args, SPARE_CORES, 0))
            status = int(args.func(args) or 0)
        dropped = signals.unheard()  # raised, then dropped on its way (sheepop.train.signals)
        return status if dropped is None else _stopped(dropped)
    except UserError as e:
        print(f"sheepop: error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt as e:  # Ctrl-C, SIGTERM or SIGHUP outside a training loop
        return _stopped(signals.heard(e))
    except ImportError:
        # A signal inside a C extension's import (numpy's, 0.2-0.3 s after the start) comes
        # out as that import's ImportError, the KeyboardInterrupt dropped (measured 1 in ~24)
        if (signum := signals.unheard()) is None:
            raise
        return _stopped(signum)
    except BrokenPipeError:  # e.g. `sheepop generate ... | head`
        return 0


def _stopped(signum: int) -> int:
    """A stop signal's one line on stderr (`sheepop: interrupted`); its exit status."""
    from sheepop.train import signals
    print(f"sheepop: {signals.stopped_by(signum)}", file=sys.stderr)
    return signals.exit_status(signum)


def _raise_on_ctrl_c() -> None:
    """Ctrl-C raises a KeyboardInterrupt again (as Python's own handler does), in place of the
    start-up handler, now that `main`'s `try` turns it into one line; an ignored SIGINT (a
    background job's) stays ignored."""
    from sheepop.train import signals
    if (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN):
        signal.signal(signal.SIGINT, signals.raise_stopped)
