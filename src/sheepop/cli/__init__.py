"""The `sheepop` command line: one entry point, one module per command.

Each module in `COMMAND_MODULES` has `register(subparsers)`, which adds its subcommand(s) with
`set_defaults(func=run)`. A `UserError` anywhere becomes one line on stderr and exit status 2,
as does a mistake in the arguments (argparse: the usage of the command it belongs to, and the
near match of a misspelt option or choice, `common.Parser`).
Ctrl-C, SIGTERM and SIGHUP stop any command with one line on stderr and exit status 128 + the
signal's number (130, 143, 129), never a traceback; training saves its last finished step first
(sheepop.train.signals).

The first moments count too. Python raises KeyboardInterrupt from its start, and a Ctrl-C while
this package and the commands' modules are imported (0.15-0.3 s after the start) printed a
traceback in 17 of 26 trials. So the first thing this module does, when it is the program
(`sheepop`, `python -m sheepop`; not when a test or a library imports it), is install
`_stop_at_start` for the three signals: one line on stderr and 128 + the signal's number, at
once (nothing has been written yet). `main` replaces it with the raising handlers inside its
`try`, which covers the parser's imports too. A signal inherited as ignored stays ignored.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

_START_MESSAGES = {signal.SIGINT: "interrupted", signal.SIGTERM: "stopped by SIGTERM"}
if hasattr(signal, "SIGHUP"):
    _START_MESSAGES[signal.SIGHUP] = "stopped by SIGHUP"


def _stop_at_start(signum: int, frame: object) -> None:
    """A stop signal before `main` handles signals: one line and the shell's status, no
    traceback (os.write and os._exit: nothing to unwind, nothing written yet)."""
    os.write(2, f"sheepop: {_START_MESSAGES[signum]}\n".encode())
    os._exit(128 + signum)


def _is_the_program() -> bool:
    """Whether this process is the `sheepop` command (its script, or `python -m sheepop`), not
    a worker of its process pools: a spawned worker runs the script again with the command's
    argv (its process named first, e.g. SpawnPoolWorker-1), and the pool ends it with SIGTERM,
    which must not print "sheepop: stopped by SIGTERM" (`prepare` did, once per worker)."""
    pools = sys.modules.get("multiprocessing")  # imported first thing in a worker
    if pools is not None and pools.current_process().name != "MainProcess":
        return False
    first = sys.argv[0] if sys.argv else ""
    path = os.path.normpath(first)
    return (os.path.basename(path) == "sheepop"
            or path.endswith(os.path.join("sheepop", "__main__.py")))


if _is_the_program() and threading.current_thread() is threading.main_thread():
    for _signum in _START_MESSAGES:
        if signal.getsignal(_signum) is not signal.SIG_IGN:
            signal.signal(_signum, _stop_at_start)

import argparse  # noqa: E402 (after the start-up handlers: these imports take time)
import importlib  # noqa: E402

from sheepop import __version__  # noqa: E402
from sheepop.cli.common import APPLY_THREADS, SPARE_CORES, Parser  # noqa: E402
from sheepop.errors import EXIT_USER_ERROR, UserError  # noqa: E402

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
    from sheepop.train import signals  # the stdlib's signal module only: loads nothing heavy

    try:
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
            return int(args.func(args) or 0)
    except UserError as e:
        print(f"sheepop: error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt as e:  # Ctrl-C, SIGTERM or SIGHUP outside a training loop
        signum = signals.signum_of(e)
        print(f"sheepop: {signals.stopped_by(signum)}", file=sys.stderr)
        return signals.exit_status(signum)
    except ImportError:
        if not _ctrl_c_seen:
            raise
        # A Ctrl-C inside a C extension's import (numpy's, 0.2-0.3 s after the start) comes
        # out as that import's ImportError, the KeyboardInterrupt dropped (measured 1 in ~24)
        print(f"sheepop: {signals.stopped_by(signal.SIGINT)}", file=sys.stderr)
        return signals.exit_status(signal.SIGINT)
    except BrokenPipeError:  # e.g. `sheepop generate ... | head`
        return 0


_ctrl_c_seen = False


def _ctrl_c(signum: int, frame: object) -> None:
    """Python's own SIGINT handler (KeyboardInterrupt), remembering that it ran."""
    global _ctrl_c_seen
    _ctrl_c_seen = True
    raise KeyboardInterrupt


def _raise_on_ctrl_c() -> None:
    """Ctrl-C raises KeyboardInterrupt again (as Python's own handler does), in place of the
    start-up handler, now that `main`'s `try` turns it into one line."""
    if (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is _stop_at_start):
        signal.signal(signal.SIGINT, _ctrl_c)
