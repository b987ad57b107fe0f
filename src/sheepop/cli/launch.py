"""`sheepop train --nproc N`: start the same command on N processes through torchrun.

It runs  python -m torch.distributed.run --standalone --nproc_per_node=N -m sheepop train ...
with the same arguments minus --nproc; each process then finds itself under torchrun and trains
its share (sheepop.train.distributed). On CPU each process gets cores // N threads (torchrun
alone would give each one thread).
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys

from sheepop.errors import UserError
from sheepop.train import signals


def argv_from_args(parser: argparse.ArgumentParser, args: argparse.Namespace,
                   drop: tuple[str, ...] = ()) -> list[str]:
    """The command-line arguments that parse back to `args` (options left at their default are
    left out), without the options whose dest is in `drop`. Typed values (the config flags'
    ints, floats and choices) are written with str(), which parses back to the same value."""
    positionals: list[str] = []
    options: list[str] = []
    for action in parser._actions:
        if action.dest in drop or isinstance(action, argparse._HelpAction):
            continue
        value = getattr(args, action.dest, None)
        if not action.option_strings:
            if value is not None:
                positionals.extend(str(v) for v in (value if isinstance(value, list) else [value]))
            continue
        flag = action.option_strings[-1]
        if isinstance(action, argparse._StoreTrueAction):
            options += [flag] if value else []
        elif isinstance(action, argparse._StoreFalseAction):
            options += [] if value else [flag]
        elif isinstance(action, argparse._AppendAction):
            for v in value or []:
                options += [flag, str(v)]
        elif isinstance(action, argparse._StoreAction):
            if value is not None and value != action.default:
                options += [flag, str(value)]
        else:
            raise TypeError(f"cannot pass on option {flag} ({type(action).__name__})")
    return positionals + options


def torchrun_command(nproc: int, argv: list[str]) -> list[str]:
    """The torchrun command line for `sheepop ARGV` on `nproc` processes of this machine."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={nproc}", "-m", "sheepop", *argv]


def launch(nproc: int, argv: list[str]) -> int:
    """Run `sheepop ARGV` on `nproc` local processes; returns the exit status."""
    if nproc < 1:
        raise UserError(f"--nproc must be at least 1, not {nproc}")
    cmd = torchrun_command(nproc, argv)
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    print(f"launching {nproc} processes: {shlex.join(cmd)}", flush=True)
    proc = subprocess.Popen(cmd, env=env)
    signum = None
    while True:
        try:
            status = proc.wait()
            break
        except KeyboardInterrupt as e:
            # Ctrl-C in a terminal reaches torchrun too; SIGTERM and SIGHUP may come to this
            # process alone (`docker stop`, systemd): pass them on once. torchrun sends them to
            # every rank, which saves and stops (sheepop.train.signals), and we wait for it.
            if signum is None and isinstance(e, signals.Stopped):
                proc.send_signal(e.signum)
            caught = signals.heard(e)
            signum = signum or caught
    if signum is not None:
        return signals.exit_status(signum)
    if status != 0:
        raise UserError(f"the {nproc}-process run failed (torchrun exit status {status}); "
                        "the failing rank's message is above")
    return 0
