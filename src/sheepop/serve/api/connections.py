"""Bounds on the connections `sheepop serve` holds: idle and slow clients, how many at once.

uvicorn's own settings do not cover a hostile client: its keep-alive timer starts only after a
response, so a connection that sends nothing, or half a request line, is held for ever; its
`limit_concurrency` answers 503 only once a whole request has arrived, so it cannot refuse those
either; and at the process's file limit asyncio's accept loop logs one traceback per attempt (up
to the listen backlog, 2048, per tick). The protocol here, uvicorn's h11 protocol with three
rules added at the connection level, keeps every connection bounded in time and their number
below the file limit:

- a connection (new, or kept alive between requests) that sends no byte for `idle` seconds is
  closed without an answer;
- a request's head and body must arrive in full within `read` seconds of its first byte (a
  client dripping one byte at a time is no exception): past it, 408 and close;
- a client that reads nothing of its answer for `idle` seconds while the server's output to it
  is past the transport's high-water mark is disconnected (its job is cancelled, as when a
  client leaves);
- past `max_connections` open connections a new one is answered 503 with Retry-After at once,
  before its request is read, and closed; at most `max_refusing` such answers linger (each
  holds a descriptor for up to REFUSAL_LINGER_S while the client reads it), past those the 503
  is written and the connection closed at once (a burst of connections, accepted together
  before any is counted, got no answer at all).

Every answer of its own is OpenAI's JSON error shape, as the app's are (a head too large for
h11's buffer gets 431, a malformed one 400, instead of uvicorn's plain text).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import resource
from dataclasses import dataclass
from typing import Any

import h11
from h11._connection import DEFAULT_MAX_INCOMPLETE_EVENT_SIZE
from uvicorn.protocols.http.h11_impl import H11Protocol

from sheepop.errors import UserError
from sheepop.serve.api.protocol import ApiError

REFUSAL_LINGER_S = 1.0  # how long a refused client may take to read its 503
OWN_FILES_MARGIN = 64   # descriptors kept free for the server's own files, past those open now
MAX_CONNECTIONS_DEFAULT = 1024
H11_MAX_HEAD = DEFAULT_MAX_INCOMPLETE_EVENT_SIZE  # bytes of a request's head (h11's buffer)


@dataclass(frozen=True)
class Limits:
    idle: float = 10.0           # seconds a connection may stay silent while a request is awaited
    read: float = 30.0           # seconds from a request's first byte to its last
    max_connections: int = 512   # open connections (more: 503 at once)
    max_refusing: int = 16       # 503 answers in flight (more: closed at once)


def file_limit() -> int:
    """The process's soft limit on open file descriptors (RLIMIT_NOFILE)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def _open_files() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:  # (no /proc: assume a model's and a server's usual few dozen)
        return 64


def connection_room() -> tuple[int, int]:
    """(the most connections the file limit leaves room for, the refusals in flight kept
    beside them): limit - open now - OWN_FILES_MARGIN, of which 1/8 (1..64) for refusals."""
    room = file_limit() - _open_files() - OWN_FILES_MARGIN
    refusing = max(1, min(64, room // 8))
    return room - refusing, refusing


def limits(idle: float, read: float, max_connections: int | None) -> Limits:
    """The Limits for these settings; `max_connections` None: what the file limit leaves room
    for, at most MAX_CONNECTIONS_DEFAULT. UserError when the file limit leaves too little."""
    room, refusing = connection_room()
    if room < 1:
        raise UserError(f"the file limit ({file_limit()} open files) leaves no room for "
                        f"connections: raise it (ulimit -n)")
    if max_connections is None:
        max_connections = min(MAX_CONNECTIONS_DEFAULT, room)
    elif max_connections > room:
        raise UserError(f"--max-connections {max_connections}: the file limit "
                        f"({file_limit()} open files) leaves room for {room}: give at most "
                        f"{room} or raise the limit (ulimit -n)")
    return Limits(idle, read, max_connections, refusing)


def error_bytes(e: ApiError) -> bytes:
    """`e` as a whole HTTP/1.1 response that closes the connection."""
    body = json.dumps(e.body()).encode()
    head = [f"HTTP/1.1 {e.status} {_REASONS[e.status]}", "content-type: application/json",
            f"content-length: {len(body)}", "connection: close",
            *(f"{k}: {v}" for k, v in e.headers.items())]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


_REASONS = {400: "Bad Request", 408: "Request Timeout", 431: "Request Header Fields Too Large",
            503: "Service Unavailable"}
BUSY = ApiError(503, "the server has too many open connections; try again shortly",
                type="server_error", code="too_many_connections", headers={"Retry-After": "1"})
SLOW = ApiError(408, "the request did not arrive in time", code="request_timeout")
HEAD_TOO_LARGE = ApiError(431, f"the request's head is larger than {H11_MAX_HEAD} bytes",
                          code="request_header_too_large")


def guarded_protocol(lim: Limits) -> type[H11Protocol]:
    """uvicorn's h11 protocol with the rules of this module (the class goes in Config.http):
    GuardedProtocol bound to one server's limits and its own set of lingering refusals."""
    return type("Guarded", (GuardedProtocol,), {"limits": lim, "refusing": set()})


class GuardedProtocol(H11Protocol):
    """One connection under the rules of this module. A connection past `max_connections` is
    refused (`_refuse`) and then only waits to be closed; any other is uvicorn's, timed: idle
    until its first byte, `read` seconds for the whole request, `idle` seconds stalled on a
    client that reads nothing."""

    limits: Limits
    refusing: set[GuardedProtocol]  # refusals lingering, at most limits.max_refusing

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._deadline: asyncio.TimerHandle | None = None
        self._stalled: asyncio.TimerHandle | None = None
        self._reading = False
        self._refused = len(self.connections) >= self.limits.max_connections
        if self._refused:
            self._refuse(transport)
            return
        super().connection_made(transport)
        self._arm(self.limits.idle, self._idle_out)

    def _refuse(self, transport: asyncio.Transport) -> None:
        """503 at once, before reading the request; the connection lingers while the client
        reads it, unless too many already do."""
        self.transport = transport
        transport.write(error_bytes(BUSY))
        if len(self.refusing) >= self.limits.max_refusing:
            transport.close()  # (at once: its descriptor is given back)
            return
        self.refusing.add(self)
        transport.write_eof()  # (then read what the client sent: closing on unread data would
        # reset the connection, and the client could lose the answer)
        self._arm(REFUSAL_LINGER_S, transport.close)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if not self._reading:
            self._reading = True
            self._arm(self.limits.read, self._read_out)
        if self.conn.their_state is h11.IDLE and _head_too_large(self.conn, data):
            self._answer(HEAD_TOO_LARGE)
            return
        super().data_received(data)
        if self.conn.their_state in (h11.DONE, h11.MUST_CLOSE, h11.CLOSED, h11.ERROR):
            self._reading = False
            self._disarm()

    def eof_received(self) -> bool | None:
        if self._refused:
            self.transport.close()
        return None

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # The next request starts with the next byte; meanwhile uvicorn's keep-alive timer
        # (Config.timeout_keep_alive = idle) holds the connection.
        self._reading = False

    def send_400_response(self, msg: str) -> None:
        data, _ = self.conn.trailing_data
        self._answer(HEAD_TOO_LARGE if len(data) > H11_MAX_HEAD else
                     ApiError(400, f"{msg.rstrip('.')}: not HTTP/1.1", code="invalid_http"))

    def _answer(self, e: ApiError) -> None:
        self.transport.write(error_bytes(e))
        self.transport.close()

    # ----- a client that reads nothing -------------------------------------------------------

    def pause_writing(self) -> None:
        if self._refused:
            return
        super().pause_writing()
        if self._stalled is None:
            self._stalled = self.loop.call_later(self.limits.idle, self._stalled_out)

    def resume_writing(self) -> None:
        if self._refused:
            return
        super().resume_writing()
        self._unstall()

    def _stalled_out(self) -> None:
        self._stalled = None
        self.transport.abort()  # (closing would wait for the buffer to drain: never)

    def _unstall(self) -> None:
        if self._stalled is not None:
            self._stalled.cancel()
            self._stalled = None

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._unstall()
        if self._refused:
            self.refusing.discard(self)
            return
        super().connection_lost(exc)

    # ----- the idle and read deadlines -------------------------------------------------------

    def _arm(self, seconds: float, then: Any) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, then)

    def _disarm(self) -> None:
        if getattr(self, "_deadline", None) is not None:
            self._deadline.cancel()
            self._deadline = None

    def _idle_out(self) -> None:
        if not self._reading and self.cycle is None and not self.transport.is_closing():
            self.transport.close()

    def _read_out(self) -> None:
        if not self._reading or self.transport.is_closing():
            return
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            if cycle.response_started:  # (a response under way: nothing more to say)
                self.transport.close()
                return
            # The head arrived but the body did not: the app's read sees a disconnection,
            # and whatever it answers is dropped for this 408.
            cycle.disconnected = True
            cycle.message_event.set()
        self._answer(SLOW)


def _head_too_large(conn: h11.Connection, data: bytes) -> bool:
    """Whether the head being received passes H11_MAX_HEAD bytes (h11 checks it only while the
    head is incomplete, and a whole one in a single read passes)."""
    buffered, _ = conn.trailing_data
    if len(buffered) + len(data) <= H11_MAX_HEAD:
        return False
    return (buffered + data).find(b"\r\n\r\n", 0, H11_MAX_HEAD + 4) < 0


class OnceLog:
    """The event loop's exception handler: each distinct message is logged once, in one line,
    without its traceback (at the file limit asyncio reports every failed accept, thousands a
    second); the repeats are counted in `repeats`."""

    def __init__(self, log: logging.Logger):
        self.log, self.repeats = log, {}

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        message = context.get("message", "unexpected error in the event loop")
        exc = context.get("exception")
        key = f"{message}: {exc}" if exc is not None else message
        if key in self.repeats:
            self.repeats[key] += 1
            return
        self.repeats[key] = 0
        self.log.error("%s (logged once; later ones are not)", key)
