"""The `sheepop` program: `python -m sheepop` and the installed `sheepop` script
(pyproject.toml's [project.scripts] names `main` here) both start in `main`.

Its first line makes Ctrl-C, SIGTERM and SIGHUP print one line on stderr and exit with 128 + the
signal's number (130, 143, 129) at once: nothing has been written yet, so there is nothing to
unwind. Only then does it import the command line, whose `main` replaces these handlers with
raising ones inside its `try` (sheepop.cli). Before this module came first, the handlers were
installed by `sheepop.cli` after its own `import signal` (enum, functools: 20-30 ms on a loaded
machine), and a signal in that time printed a KeyboardInterrupt traceback (Ctrl-C) or ended the
process without a word (SIGTERM, SIGHUP).

So this module imports nothing that is not loaded before any Python program runs: `_signal` is
the C half of `signal` (which would import enum), `os` and `sys` come with the interpreter's
start. What remains before the first line of `main` is the interpreter's own start (site,
`.pth` files, runpy for `-m`): a signal there is Python's to report (docs/reliability.md).

A worker that a process pool spawns runs the script again as `__mp_main__`: it imports this
module, never calls `main`, and so installs no handler (the pool ends its workers with SIGTERM).
"""

import _signal  # `signal` without its enum: installed before anything else is imported
import os
import sys

# What sheepop.train.signals.stopped_by says for each (its `signal` import is what we avoid).
START_MESSAGES = {_signal.SIGINT: "interrupted", _signal.SIGTERM: "stopped by SIGTERM"}
if hasattr(_signal, "SIGHUP"):  # not on Windows
    START_MESSAGES[_signal.SIGHUP] = "stopped by SIGHUP"


def stop_at_start(signum: int, frame: object) -> None:
    """A stop signal before the command line handles signals: one line and the shell's status,
    no traceback (os.write and os._exit: nothing to unwind, nothing written yet)."""
    os.write(2, f"sheepop: {START_MESSAGES[signum]}\n".encode())
    os._exit(128 + signum)


def main() -> int:
    """Run the command line of sys.argv, stop signals handled from this first line on. A
    signal the process inherited as ignored (nohup's SIGHUP, a background job's SIGINT) stays
    ignored."""
    for signum in START_MESSAGES:
        if _signal.getsignal(signum) != _signal.SIG_IGN:
            _signal.signal(signum, stop_at_start)
    from sheepop.cli import main as command_line

    return command_line(as_program=True)


if __name__ == "__main__":
    sys.exit(main())
