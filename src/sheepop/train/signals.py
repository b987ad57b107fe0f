"""Stopping on a signal: Ctrl-C (SIGINT), SIGTERM and SIGHUP stop a run the same way.

SIGTERM is what `docker stop`, systemd, Kubernetes, Slurm and torchrun send before they kill a
process; SIGHUP is a closed terminal. Two phases:

- Outside the training loop (start-up: reading data, training a tokenizer; teardown: plots),
  `raising_stop_signals()` makes SIGTERM and SIGHUP raise `Stopped`, a KeyboardInterrupt, so they
  unwind exactly as Ctrl-C does and the command line prints one line (`sheepop.cli.main`).
- Inside the loop, `StopRequest` only *records* the first of the three signals: the step in
  progress finishes, the loop stops at that step boundary and saves it. A signal never raises in
  the middle of an optimizer update (which could tear it) nor inside a checkpoint's writes (a
  second Ctrl-C during the save used to print a traceback from inside os.fsync): later signals
  are noted and change nothing, so the save completes. SIGKILL cannot be caught; the checkpoint's
  own all-or-nothing writes cover it.

A raised signal can be dropped on its way: Python drops an exception raised inside a finaliser
(a generator closed by the garbage collector, a `__del__`: "Exception ignored in ..."), and a C
extension's import can turn it into an ImportError that an optional import catches. Measured:
`sheepop train` given SIGHUP while importing torch trained all its steps and exited 0 (the
handler had raised inside a generator that `any()` left and the collector closed). So the
handlers record the signal they raise until sheepop catches it (`heard`): the training loop
takes one still unheard as its stop request, and the command line ends on it once the command
returns (`unheard`).

Exit status: 128 + the signal's number, as a shell reports a process a signal stopped: SIGINT
130, SIGHUP 129, SIGTERM 143.

A signal the process inherited as ignored stays ignored: `nohup sheepop train` sets SIGHUP to
SIG_IGN so that closing the terminal does not stop the run, and a shell starts a background job
(`cmd &` in a script) with SIGINT ignored. Replacing that SIG_IGN by a handler would stop the run
on the very signal its user asked to be ignored.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from functools import partial
from types import FrameType
from typing import Any

# SIGHUP does not exist on Windows.
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP")
                     if hasattr(signal, name))
RAISING_SIGNALS = tuple(s for s in STOP_SIGNALS if s != signal.SIGINT)  # SIGINT already raises


class Stopped(KeyboardInterrupt):
    """A stop signal received outside the training loop: unwinds as Ctrl-C does."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


def stopped_by(signum: int) -> str:
    """"interrupted" for Ctrl-C, "stopped by SIGTERM" for the others."""
    return "interrupted" if signum == signal.SIGINT else f"stopped by {signal_name(signum)}"


def signum_of(interrupt: BaseException) -> int:
    """The signal behind a KeyboardInterrupt: a `Stopped`'s, else SIGINT (Ctrl-C)."""
    return int(getattr(interrupt, "signum", signal.SIGINT))


_unheard: int | None = None  # the signal `raise_stopped` last raised, until `heard` (above)


def raise_stopped(signum: int, frame: FrameType | None) -> None:
    """A handler: raise `Stopped`, the signal noted until sheepop catches it (`heard`)."""
    global _unheard
    _unheard = signum
    raise Stopped(signum)


def heard(interrupt: BaseException) -> int:
    """The signal behind a KeyboardInterrupt that sheepop has caught: no longer unheard."""
    global _unheard
    _unheard = None
    return signum_of(interrupt)


def unheard() -> int | None:
    """The signal a handler raised whose exception was dropped before sheepop caught it (the
    module's docstring), taken: None when there is none."""
    global _unheard
    signum, _unheard = _unheard, None
    return signum


def exit_status(signum: int | None) -> int:
    """128 + the signal number (SIGINT when None), as a shell reports it."""
    return 128 + int(signum or signal.SIGINT)


def _in_main_thread() -> bool:
    # Python lets only the main thread set signal handlers (and runs them there).
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def _handlers(signums: tuple[int, ...], handler: Any) -> Iterator[None]:
    """`handler` for `signums` inside the block, the previous handlers restored after it."""
    if not _in_main_thread():
        yield
        return
    # An ignored signal keeps its SIG_IGN (nohup, a background job): see the module's docstring.
    previous = {s: signal.signal(s, handler) for s in signums
                if signal.getsignal(s) is not signal.SIG_IGN}
    try:
        yield
    finally:
        for s, old in previous.items():
            signal.signal(s, old if old is not None else signal.SIG_DFL)


@contextlib.contextmanager
def raising_stop_signals() -> Iterator[None]:
    """Inside the block SIGTERM and SIGHUP raise `Stopped` (a KeyboardInterrupt), as Ctrl-C
    raises KeyboardInterrupt. One that leaves the block is on its way to be caught: heard."""
    global _unheard
    hook = sys.unraisablehook
    sys.unraisablehook = partial(_quiet_if_dropped, hook)
    with _handlers(RAISING_SIGNALS, raise_stopped):
        try:
            yield
        except KeyboardInterrupt:
            _unheard = None
            raise
        finally:
            sys.unraisablehook = hook


def _quiet_if_dropped(hook: Callable[[Any], None], unraisable: Any) -> None:
    """Python's report of an exception a finaliser dropped ("Exception ignored in", a
    traceback), except for the stop signal `raise_stopped` raised there: it is still noted
    (`unheard`), and the command line says it in one line."""
    if not (isinstance(unraisable.exc_value, Stopped) and _unheard is not None):
        hook(unraisable)


class StopRequest:
    """While training: SIGINT, SIGTERM and SIGHUP are recorded, not raised.

    `signum` is the first one received (None until then; on entry, a raised signal that was
    dropped, `unheard`); `repeats` counts the later ones. The loop reads `signum` at each step
    boundary. Nothing is printed from the handler itself: a handler runs between two bytecodes
    of the main thread, possibly inside a print, and a re-entrant write to stdout raises.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self.repeats = 0
        self._block: contextlib.AbstractContextManager[None] | None = None

    def _record(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is None:
            self.signum = signum
        else:
            self.repeats += 1

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def __enter__(self) -> StopRequest:
        self.signum = unheard()
        self._block = _handlers(STOP_SIGNALS, self._record)
        self._block.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        assert self._block is not None
        self._block.__exit__(*exc)
        self._block = None


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Inside the block the three signals are recorded, and the first is raised as `Stopped`
    once the block has ended. For code a KeyboardInterrupt must not cut in the middle: a
    Ctrl-C during `import torch` was measured to abort the process from inside torch's C++
    start-up ("terminate called after throwing ... KeyboardInterrupt", SIGABRT)."""
    with StopRequest() as request:
        yield
    if request.signum is not None:
        raise Stopped(request.signum)
