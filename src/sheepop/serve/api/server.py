"""Running the app under uvicorn: the listening socket, the ready line, a graceful stop.

The socket is bound here, before uvicorn starts, so that `--port 0` (any free port) can be
reported: the ready line names the address actually bound, once the app has started.

Stopping: SIGINT (Ctrl-C) or SIGTERM makes uvicorn stop accepting connections and wait up to
`shutdown_timeout` seconds for the open ones, whose requests keep generating meanwhile; then it
cancels what is left (each stream's job is cancelled with it), the app's lifespan stops the
scheduler, and the command exits 0: a signal is how a server is meant to stop. A second Ctrl-C
during that wait stops at once.

Connections are bounded (sheepop.serve.api.connections): idle and slow clients are timed out, and
past a number of open connections kept below the file limit a new one gets 503 at once; at
the file limit itself the connections waiting to be accepted get 503 too, from a descriptor kept
in reserve (sheepop.serve.api.file_limit). The event loop's other errors are logged once each, in
one line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import threading
from collections.abc import Callable, Iterator

import uvicorn
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send

from sheepop.errors import UserError
from sheepop.serve.api.app import error_response
from sheepop.serve.api.connections import Limits, guarded_protocol
from sheepop.serve.api.file_limit import AtFileLimit
from sheepop.serve.api.scheduler import SHUTTING_DOWN

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
FORCED_STOP_S = 2.0  # after a second Ctrl-C, how long the cancelled requests have to end


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (port 0: a free one); UserError when refused."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as e:
        raise UserError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as e:
        sock.close()
        raise UserError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock


def address_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, ready: Callable[[], None],
                 loop_errors: AtFileLimit):
        super().__init__(config)
        self.ready, self.loop_errors = ready, loop_errors

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """SIGINT and SIGTERM stop the server (a second SIGINT: at once); once it has stopped
        they are ignored while the process exits. (uvicorn raises the signals it caught again
        on its way out, inside the event loop, where asyncio turns them into a
        KeyboardInterrupt that cancels the app's lifespan mid-way: a traceback.)"""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        for sig in STOP_SIGNALS:
            signal.signal(sig, self.handle_exit)
        try:
            yield
        finally:
            for sig in STOP_SIGNALS:
                signal.signal(sig, signal.SIG_IGN)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await super().shutdown(sockets)
        if self.force_exit:
            # uvicorn skips the app's shutdown then; it is quick (the scheduler's thread
            # stops after its current step). Every connection is closed: a request sees its
            # client gone (its job is cancelled), as if the client had left; what has not
            # ended after FORCED_STOP_S is cancelled.
            for connection in list(self.server_state.connections):
                connection.transport.close()
            if self.server_state.tasks:
                await asyncio.wait(list(self.server_state.tasks), timeout=FORCED_STOP_S)
            for task in list(self.server_state.tasks):
                task.cancel()
            await self.lifespan.shutdown()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        asyncio.get_running_loop().set_exception_handler(self.loop_errors)
        await super().startup(sockets)
        if self.started:
            self.ready()


class QuietDisconnect:
    """A request whose client went away (or was timed out) while its body was read ends
    without uvicorn's "Exception in ASGI application" traceback: nobody is there to answer.
    One cancelled by the graceful stop's deadline before it answered (its body still
    arriving) gets 503 `shutting_down` in the API's error shape: uvicorn sent a plain-text 500
    and logged the cancellation's traceback."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def sending(message: dict) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except ClientDisconnect:
            pass
        except asyncio.CancelledError:
            if scope["type"] != "http" or started:
                raise
            await error_response(SHUTTING_DOWN)(scope, receive, send)


def run(app: Starlette, sock: socket.socket, shutdown_timeout: float,
        ready: Callable[[], None], access_log: bool = False, limits: Limits | None = None
        ) -> None:
    """Serve `app` on `sock` until SIGINT or SIGTERM; `ready()` once it accepts requests."""
    limits = limits or Limits()
    config = uvicorn.Config(QuietDisconnect(app), log_level="info" if access_log else "warning",
                            access_log=access_log, lifespan="on",
                            timeout_graceful_shutdown=shutdown_timeout,
                            http=guarded_protocol(limits), timeout_keep_alive=limits.idle)
    loop_errors = AtFileLimit(sock, logging.getLogger("uvicorn.error"))
    try:
        _Server(config, ready, loop_errors).run(sockets=[sock])
    finally:
        loop_errors.close()
