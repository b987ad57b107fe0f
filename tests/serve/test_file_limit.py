"""At the open-file limit every connection still gets an answer (sheepop.serve.api.file_limit): a
`sheepop serve` subprocess whose limit is lowered below its cap, and a burst of connections
accepted together before any is counted. Raw sockets on 127.0.0.1; every wait is bounded."""

from __future__ import annotations

import json
import os
import resource
import selectors
import socket
import time

import pytest
from serve_helpers import BOUND_S, ServerProcess, call

FILES = 160  # the server's open-file limit at its start


def _low_file_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FILES, resource.getrlimit(
        resource.RLIMIT_NOFILE)[1]))


def _connect(srv: ServerProcess) -> socket.socket:
    return socket.create_connection(("127.0.0.1", int(srv.url.rsplit(":", 1)[1])),
                                    timeout=BOUND_S)


def _response(s: socket.socket, bound_s: float = 20.0) -> tuple[int, dict[str, str], bytes]:
    """One HTTP response read from `s` (its head and content-length bytes of body); status 0
    when the connection ended first or nothing came within bound_s. A reset after the answer
    (Linux delivers what arrived before it) ends the reading."""
    data, deadline = b"", time.monotonic() + bound_s
    while time.monotonic() < deadline:
        head, sep, body = data.partition(b"\r\n\r\n")
        if sep:
            lines = head.decode().split("\r\n")
            headers = dict(line.lower().split(": ", 1) for line in lines[1:])
            if len(body) >= int(headers.get("content-length", 0)):
                return int(lines[0].split()[1]), headers, body
        s.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = s.recv(65536)
        except (TimeoutError, ConnectionResetError):
            break
        if not chunk:
            break
        data += chunk
    return 0, {}, data


def _is_busy(status: int, headers: dict[str, str], body: bytes) -> bool:
    return (status == 503 and headers.get("retry-after") == "1"
            and json.loads(body)["error"]["code"] == "too_many_connections")


def _serves_again(srv: ServerProcess) -> bool:
    deadline = time.monotonic() + BOUND_S
    while (reply := call(srv.url, "GET", "/health")).status == 503:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return reply.status == 200


KEEP_ALIVE = b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n"


@pytest.mark.skipif(not hasattr(resource, "prlimit"), reason="needs Linux's prlimit")
def test_at_the_file_limit_a_new_connection_gets_503_and_the_server_keeps_serving(runs):
    """The limit lowered under a running server to what it holds + 12, below the cap it
    computed at its start (as when its own files grow): connections, each sending a
    kept-alive request, are served 200 and held until accept() fails for want of
    descriptors; from then each new one gets 503 as JSON, and the server serves again once
    they close, with no "Too many open files" in its log. Before: accept()'s EMFILE was
    logged ("socket.accept() out of system resource: [Errno 24] Too many open files") and the
    new connections waited unanswered."""
    srv = ServerProcess(runs[1], "--engine", "numpy", "--timeout-idle", "60",
                        preexec_fn=_low_file_limit)
    held: list[socket.socket] = []
    answers = []
    try:
        hard = resource.prlimit(srv.proc.pid, resource.RLIMIT_NOFILE)[1]
        holding = len(os.listdir(f"/proc/{srv.proc.pid}/fd"))
        resource.prlimit(srv.proc.pid, resource.RLIMIT_NOFILE, (holding + 12, hard))
        while len(answers) < 40 and sum(a[0] == 503 for a in answers) < 5:
            s = _connect(srv)
            s.sendall(KEEP_ALIVE)
            answers.append(answer := _response(s))
            if answer[0] == 200:
                held.append(s)
            else:
                s.close()
        busy = [a for a in answers if a[0] != 200]
        assert 1 <= len(held) <= 12 and len(busy) == 5 and all(_is_busy(*a) for a in busy), [
            a[:2] for a in answers]
        for s in held:
            s.close()
        assert _serves_again(srv)
    finally:
        for s in held:
            s.close()
        assert srv.stop() == 0
    log = "".join(srv.lines)
    assert "Too many open files" not in log and "Traceback" not in log
    assert log.count("open-file limit") == 1


def test_a_burst_of_connections_past_the_limit_each_gets_an_answer(runs):
    """400 connections opened at once against a server whose limit is FILES and whose cap is
    20: asyncio accepts them in batches before any is counted (past the limit: EMFILE), so
    every one but the 20 held must still be answered 503 as JSON, never closed or reset
    without a word; each held one then serves its request (200). Before: 61 of 300 closed
    without an answer (past 16 lingering refusals a connection was aborted), and the log said
    "Too many open files"."""
    srv = ServerProcess(runs[1], "--engine", "numpy", "--timeout-idle", "60",
                        "--max-connections", "20", preexec_fn=_low_file_limit)
    socks = [_connect(srv) for _ in range(400)]
    try:
        answered: dict[socket.socket, bytes] = {}
        with selectors.DefaultSelector() as sel:
            for s in socks:
                s.setblocking(False)
                sel.register(s, selectors.EVENT_READ, b"")
            deadline = time.monotonic() + BOUND_S
            while len(answered) < len(socks) - 20 and time.monotonic() < deadline:
                for key, _ in sel.select(timeout=1.0):
                    try:
                        chunk = key.fileobj.recv(65536)
                    except ConnectionResetError:
                        chunk = b""
                    if chunk:
                        sel.modify(key.fileobj, selectors.EVENT_READ, key.data + chunk)
                    else:  # closed: its whole answer is in
                        answered[key.fileobj] = key.data
                        sel.unregister(key.fileobj)
        silent = [s for s in socks if s not in answered]
        assert len(silent) == 20
        refused = [_response(_Replay(data)) for data in answered.values()]
        assert all(_is_busy(*a) for a in refused), sorted({a[0] for a in refused})
        for s in silent:
            s.setblocking(True)
            s.sendall(KEEP_ALIVE)
            assert _response(s)[0] == 200
        for s in socks:
            s.close()
        assert _serves_again(srv)
    finally:
        for s in socks:
            s.close()
        assert srv.stop() == 0
    log = "".join(srv.lines)
    assert "Too many open files" not in log and "Traceback" not in log


class _Replay:
    """Bytes already received, read back as a socket that then ends (for `_response`)."""

    def __init__(self, data: bytes):
        self.data = data

    def settimeout(self, seconds: float) -> None:
        pass

    def recv(self, n: int) -> bytes:
        chunk, self.data = self.data[:n], self.data[n:]
        return chunk
