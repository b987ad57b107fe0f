"""At the process's open-file limit, connections still get an answer: 503, as JSON.

The cap on open connections (sheepop.serve.api.connections) keeps the server below its file limit
as connections are counted, but asyncio accepts a burst of them (up to the listen backlog) before
any is counted, and the limit can also be lowered under a running server (`prlimit`) or its own
files can grow. Then `accept()` fails with EMFILE: asyncio reports it to the loop's exception
handler, stops accepting for a second and tries again, while the clients wait unanswered (and
it logged "Too many open files"). A client that connected is owed an answer, and answering needs
a descriptor: so one is kept in reserve (`/dev/null`, opened at start). On EMFILE (or ENFILE,
the system's limit) the handler here closes the reserve, and with the descriptor it frees
accepts each waiting connection in turn, writes it the 503 `too_many_connections` answer, and
closes it; then it takes the reserve back. The server keeps serving the connections it holds
and accepts again once some close.

Linux's accept() takes a descriptor before it looks for a connection, so at the limit it fails
with EMFILE even when none is waiting, and asyncio tries again up to the backlog's 2048 times
in the same turn of the loop: the waiting ones are answered on the first failure of a turn.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
from typing import Any

from sheepop.serve.api.connections import BUSY, OnceLog, error_bytes, file_limit

OUT_OF_FILES = (errno.EMFILE, errno.ENFILE)
MOST_REFUSED_AT_ONCE = 4096  # waiting connections answered per failed accept (the backlog: 2048)


def _reserve() -> int | None:
    """A descriptor to give back when one is needed (None when none is left to take)."""
    try:
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


def _refuse(conn: socket.socket, answer: bytes) -> None:
    """Write `answer` to a connection that was not read and close it, reading what its client
    already sent first (closing on unread data resets the connection, which may cost the client
    its answer)."""
    try:
        conn.setblocking(False)
        conn.send(answer)
        conn.shutdown(socket.SHUT_WR)
        conn.recv(65536)
    except OSError:
        pass
    finally:
        conn.close()


class AtFileLimit:
    """The event loop's exception handler: a failed accept for want of descriptors on the
    server's listening socket answers the waiting connections 503 from the reserve; every
    other error goes to OnceLog (logged once, in one line)."""

    def __init__(self, listening: socket.socket, log: logging.Logger):
        self.listening, self.log, self.once = listening, log, OnceLog(log)
        self.reserve = _reserve()
        self.said = self.answered_this_turn = False

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc, sock = context.get("exception"), context.get("socket")
        if (isinstance(exc, OSError) and exc.errno in OUT_OF_FILES and sock is not None
                and sock.fileno() == self.listening.fileno()):
            if self.reserve is None:
                self.once(loop, context)
            elif not self.answered_this_turn:
                self.answered_this_turn = True
                loop.call_soon(setattr, self, "answered_this_turn", False)
                self.refuse_waiting()
        elif (self.listening.fileno() == -1 and isinstance(exc, ValueError)
              and "_start_serving" in context.get("message", "")):
            return  # asyncio's retry of accept(), a second after EMFILE, after the server closed
        else:
            self.once(loop, context)

    def refuse_waiting(self) -> None:
        """Answer 503 to every connection waiting to be accepted, with the reserve's
        descriptor; then take the reserve back."""
        if not self.said:
            self.said = True
            self.log.warning("the open-file limit (%d) is reached: new connections get 503 "
                             "until some close (raise it: ulimit -n; said once)", file_limit())
        os.close(self.reserve)
        answer = error_bytes(BUSY)
        try:
            for _ in range(MOST_REFUSED_AT_ONCE):
                try:
                    conn, _ = self.listening.accept()
                except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                    break  # none left waiting
                except OSError:
                    break  # the freed descriptor was taken by another thread meanwhile
                _refuse(conn, answer)
        finally:
            self.reserve = _reserve()

    def close(self) -> None:
        if self.reserve is not None:
            os.close(self.reserve)
            self.reserve = None
