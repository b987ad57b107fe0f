"""Only this server's own page, and clients that are not browsers, may call it (docs/serve.md,
"Which pages may call the server").

A server on localhost without an API key is reachable by every web page the user opens: a page
may POST to http://127.0.0.1:8000 (a `text/plain` body needs no CORS preflight, so the browser
sends it), and through DNS rebinding (a name of the attacker's that resolves to 127.0.0.1) it may
even read the answers. Two rules close both doors, before any route or key check:

- Host: the name the request was sent to must be `localhost`, a loopback address, the address
  bound (any IP address when bound to all of them, 0.0.0.0 or ::), the name given as --host, or
  the host of an allowed origin. A rebinding page's requests carry its own name: refused.
- Origin: a browser names the page a request comes from; it must be this server's own
  (`http://` or `https://` and the request's Host) or one of `origins` (--allow-origin). A request
  without Origin (curl, the openai client, a page's own GETs) passes; `Origin: null` (a sandboxed
  or local file's page) does not.

A refusal is 403 with OpenAI's error JSON. An allowed other origin gets CORS: its preflight
(OPTIONS) is answered here, and every answer names it in Access-Control-Allow-Origin.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Sequence
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

ORIGIN = re.compile(r"(https?)://(\[[0-9a-f:.]+\]|[a-z0-9.-]+)(:[0-9]{1,5})?")
CORS_HEADERS = [(b"access-control-allow-methods", b"GET, POST, OPTIONS"),
                (b"access-control-allow-headers", b"authorization, content-type"),
                (b"access-control-max-age", b"600")]


def origin_problem(origin: str) -> str | None:
    """Why `origin` is not an origin for --allow-origin ("scheme://host[:port]"), or None."""
    if not ORIGIN.fullmatch(origin.lower()):
        return (f"--allow-origin {origin!r}: an origin is http:// or https://, a host and an "
                f"optional port, nothing after (as a browser's Origin header: "
                f"'http://localhost:3000')")
    return None


def host_name(host: str) -> str:
    """The name in a Host header, without its port or brackets, lowercase."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host[1:]
    return host.rsplit(":", 1)[0].rstrip(".")


class SameOrigin:
    """ASGI middleware: 403 for a request to another Host or from another site's page."""

    def __init__(self, app: ASGIApp, host: str, origins: Sequence[str] = ()):
        self.app = app
        self.origins = {o.lower().rstrip("/") for o in origins}
        self.names = {"localhost", host_name(host)} | {host_name(urlsplit(o).netloc)
                                                       for o in self.origins}
        try:
            self.bound = ipaddress.ip_address(host_name(host))
        except ValueError:
            self.bound = None

    def host_allowed(self, host: str) -> bool:
        name = host_name(host)
        if name in self.names:
            return True
        try:
            ip = ipaddress.ip_address(name)
        except ValueError:
            return False
        return ip.is_loopback or ip == self.bound or bool(self.bound
                                                          and self.bound.is_unspecified)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        host = headers.get(b"host", b"").decode("latin-1")
        origin = headers.get(b"origin", b"").decode("latin-1").lower()
        if host and not self.host_allowed(host):
            await _refuse(send, f"this server does not answer requests for the host "
                                f"{host[:80]!r}: use localhost or the address it listens on",
                          "host_not_allowed")
            return
        if not origin or origin in (f"http://{host.lower()}", f"https://{host.lower()}"):
            await self.app(scope, receive, send)
            return
        if origin not in self.origins:
            await _refuse(send, f"requests from pages of {origin[:80]!r} are refused: only "
                                f"this server's own page may call it (sheepop serve "
                                f"--allow-origin names others)", "origin_not_allowed")
            return
        allow = [(b"access-control-allow-origin", origin.encode("latin-1")), (b"vary", b"origin")]
        if scope["method"] == "OPTIONS" and b"access-control-request-method" in headers:
            await send({"type": "http.response.start", "status": 204,
                        "headers": allow + CORS_HEADERS})
            await send({"type": "http.response.body", "body": b""})
            return

        async def send_allowed(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *allow]}
            await send(message)

        await self.app(scope, receive, send_allowed)


async def _refuse(send: Send, message: str, code: str) -> None:
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error",
                                 "param": None, "code": code}}).encode()
    await send({"type": "http.response.start", "status": 403, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
