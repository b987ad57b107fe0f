"""Running the app under uvicorn: the listening socket, the ready line, a graceful stop.

The socket is bound here, before uvicorn starts, so that `--port 0` (any free port) can be
reported: the ready line names the address actually bound, once the app has started.

Stopping: SIGINT (Ctrl-C) or SIGTERM makes uvicorn stop accepting connections and wait up to
`shutdown_timeout` seconds for the open ones, whose requests keep generating meanwhile; then it
cancels what is left (each stream's job is cancelled with it), the app's lifespan stops the
scheduler, and the command exits 0: a signal is how a server is meant to stop. A second Ctrl-C
during that wait stops at once.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

import uvicorn
from starlette.applications import Starlette

from sheepop.errors import UserError


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
    def __init__(self, config: uvicorn.Config, ready: Callable[[], None]):
        super().__init__(config)
        self.ready = ready

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            self.ready()


def run(app: Starlette, sock: socket.socket, shutdown_timeout: float,
        ready: Callable[[], None], access_log: bool = False) -> None:
    """Serve `app` on `sock` until SIGINT or SIGTERM; `ready()` once it accepts requests."""
    config = uvicorn.Config(app, log_level="info" if access_log else "warning",
                            access_log=access_log, lifespan="on",
                            timeout_graceful_shutdown=shutdown_timeout)
    server = _Server(config, ready)
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        # uvicorn raises the signal again once it has shut down, for the caller's handlers:
        # here the stop it asked for is done.
        if not server.should_exit:
            raise
