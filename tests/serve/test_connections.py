"""Hostile connections (sheepop.serve.api.connections): silent and half-sent requests are timed out,
open connections are capped below the file limit (503 past it, JSON), an oversized head gets
OpenAI's JSON error, a second Ctrl-C stops at once without a traceback. Raw sockets to the
server's ephemeral port on 127.0.0.1; every wait has a time bound."""

from __future__ import annotations

import json
import logging
import resource
import signal
import socket
import time

import pytest
from serve_helpers import BOUND_S, ServerProcess, call

from sheepop.serve.api.connections import OnceLog

FILES = 160  # the server subprocess's open-file limit in the cap tests


def _port(srv: ServerProcess) -> int:
    return int(srv.url.rsplit(":", 1)[1])


def _connect(srv: ServerProcess) -> socket.socket:
    return socket.create_connection(("127.0.0.1", _port(srv)), timeout=BOUND_S)


def _read_to_end(s: socket.socket, bound_s: float = 15.0) -> tuple[bytes, float]:
    """Everything the server sends until it closes (at most bound_s), and when it closed."""
    start, data = time.monotonic(), b""
    s.settimeout(bound_s)
    try:
        while time.monotonic() - start < bound_s:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    except TimeoutError:
        pass
    finally:
        s.close()
    return data, time.monotonic() - start


def _error(raw: bytes) -> tuple[int, dict[str, str], dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, json.loads(body)


def _request(path: str = "/health") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode()


def _low_file_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FILES, resource.getrlimit(
        resource.RLIMIT_NOFILE)[1]))


@pytest.fixture(scope="module")
def quick(runs):
    """A server that times clients out quickly: 0.5 s silent, 1.5 s to send a request."""
    s = ServerProcess(runs[1], "--engine", "numpy", "--timeout-idle", "0.5",
                      "--timeout-read", "1.5")
    yield s
    assert s.stop(signal.SIGTERM) == 0
    assert "Traceback" not in "".join(s.lines)


def test_a_silent_connection_is_closed_after_the_idle_timeout(quick):
    data, after = _read_to_end(_connect(quick))
    assert data == b"" and 0.4 < after < 5  # closed, without an answer


def test_a_kept_alive_connection_is_closed_once_idle(quick):
    s = _connect(quick)
    s.sendall(_request().replace(b"Connection: close\r\n", b""))
    data, after = _read_to_end(s)
    assert data.startswith(b"HTTP/1.1 200 ") and 0.4 < after < 5


@pytest.mark.parametrize("sent", [
    b"GET /hea",                                                         # half a request line
    b"GET /health HTTP/1.1\r\nHost: localhost\r\n",                      # a head without its end
    b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
    b"Content-Length: 100\r\n\r\n{\"prompt\": ",                         # half a body
])
def test_half_a_request_gets_408_as_json_past_the_read_timeout(quick, sent):
    s = _connect(quick)
    s.sendall(sent)
    status, headers, body = _error(_read_to_end(s)[0])
    assert status == 408 and headers["connection"] == "close"
    assert body["error"]["code"] == "request_timeout"
    assert call(quick.url, "GET", "/health").status == 200


def test_a_client_dripping_bytes_is_cut_at_the_read_timeout(quick):
    s = _connect(quick)
    start, request = time.monotonic(), _request()
    for i in range(len(request)):  # one byte every 0.3 s: each gap under the idle timeout
        try:
            s.send(request[i:i + 1])
        except OSError:
            break
        if time.monotonic() - start > 3:
            break
        time.sleep(0.3)
    raw, _ = _read_to_end(s)
    assert time.monotonic() - start < 5
    assert _error(raw)[0] == 408


@pytest.mark.parametrize("chunks", [1, 2])
def test_an_oversized_head_gets_431_as_json(quick, chunks):
    request = _request().replace(b"\r\n\r\n", b"\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n")
    s = _connect(quick)
    if chunks == 1:
        s.sendall(request)
    else:  # h11 finds it past its buffer while the head is incomplete
        s.sendall(request[:100])
        time.sleep(0.1)
        s.sendall(request[100:])
    status, headers, body = _error(_read_to_end(s)[0])
    assert status == 431 and headers["content-type"] == "application/json"
    assert body["error"]["code"] == "request_header_too_large"


def test_a_malformed_request_gets_400_as_json(quick):
    s = _connect(quick)
    s.sendall(b"NOT HTTP AT ALL\r\n\r\n")
    status, headers, body = _error(_read_to_end(s)[0])
    assert status == 400 and body["error"]["code"] == "invalid_http"


def _hold_until_refused(srv: ServerProcess, most: int) -> tuple[list[socket.socket], bytes]:
    """Open connections that send nothing until one is answered (at most `most`)."""
    held: list[socket.socket] = []
    for _ in range(most):
        s = _connect(srv)
        s.settimeout(0.1)  # a refusal is written as soon as the connection is accepted
        try:
            answer = s.recv(65536)
        except TimeoutError:
            held.append(s)
            continue
        s.close()
        return held, answer
    return held, b""


def _close_and_answered(srv: ServerProcess, held: list[socket.socket]) -> None:
    """Close the held connections; the server answers /health again within BOUND_S."""
    for s in held:
        s.close()
    deadline = time.monotonic() + BOUND_S
    while (reply := call(srv.url, "GET", "/health")).status == 503:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert reply.status == 200


def test_past_max_connections_a_new_one_gets_503_at_once(runs):
    srv = ServerProcess(runs[1], "--engine", "numpy", "--max-connections", "6",
                        "--timeout-idle", "60", preexec_fn=_low_file_limit)
    try:
        held, answer = _hold_until_refused(srv, 20)
        assert len(held) == 6
        status, headers, body = _error(answer)
        assert status == 503 and headers["retry-after"] == "1"
        assert body["error"]["code"] == "too_many_connections"
        _close_and_answered(srv, held)
    finally:
        assert srv.stop() == 0


def test_the_default_cap_stays_below_the_file_limit(runs):
    """At a limit of FILES open files, idle connections are refused before the process runs
    out of descriptors: no "Too many open files", and the server answers once they close."""
    srv = ServerProcess(runs[1], "--engine", "numpy", "--timeout-idle", "60",
                        preexec_fn=_low_file_limit)
    try:
        held, answer = _hold_until_refused(srv, FILES + 10)
        assert 10 < len(held) < FILES and _error(answer)[0] == 503
        _close_and_answered(srv, held)
    finally:
        assert srv.stop() == 0
    log = "".join(srv.lines)
    assert "Too many open files" not in log and "Traceback" not in log


def test_a_cap_past_the_file_limit_is_refused_in_one_line(runs):
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "sheepop", "serve", str(runs[1]), "--engine",
                        "numpy", "--port", "0", "--max-connections", "100000"],
                       capture_output=True, text=True, timeout=BOUND_S,
                       preexec_fn=_low_file_limit)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1
    assert "--max-connections 100000" in r.stderr and "ulimit -n" in r.stderr


def test_a_second_ctrl_c_stops_at_once_without_a_traceback(runs):
    srv = ServerProcess(runs[1], "--engine", "numpy", "--shutdown-timeout", "60",
                        "--timeout-read", "60")
    s = _connect(srv)  # a request whose body never comes: the graceful stop waits for it
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: 50\r\n\r\n{")
    time.sleep(0.3)
    srv.proc.send_signal(signal.SIGINT)
    time.sleep(1.0)
    assert srv.proc.poll() is None  # still waiting for that request
    srv.proc.send_signal(signal.SIGINT)
    start = time.monotonic()
    assert srv.stop(signal.SIGINT) == 0
    assert time.monotonic() - start < 10
    s.close()
    log = "".join(srv.lines)
    assert "Traceback" not in log and log.endswith("sheepop: server stopped\n")


def test_a_repeated_event_loop_error_is_logged_once(caplog):
    handler = OnceLog(logging.getLogger("test-once"))
    error = OSError(24, "Too many open files")
    with caplog.at_level(logging.ERROR, logger="test-once"):
        for _ in range(1000):
            handler(None, {"message": "socket.accept() out of system resource",
                           "exception": error})
        handler(None, {"message": "another"})
    assert [r.getMessage() for r in caplog.records] == [
        "socket.accept() out of system resource: [Errno 24] Too many open files (logged "
        "once; later ones are not)", "another (logged once; later ones are not)"]
    assert handler.repeats["socket.accept() out of system resource: [Errno 24] Too many "
                           "open files"] == 999


def test_a_client_that_reads_nothing_of_its_answer_is_disconnected():
    """The protocol alone, under an endless answer whose client never reads: once the server's
    buffer for it is full, `idle` seconds later the connection is dropped and the app's sends
    stop blocking (before: they waited for ever, holding the connection)."""
    import asyncio

    import uvicorn
    from uvicorn.server import ServerState

    from sheepop.serve.api.connections import Limits, guarded_protocol

    sent: list[int] = []

    async def endless(scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for _ in range(20_000):  # 1.3 GB at most, never buffered: each send waits to drain
            await send({"type": "http.response.body", "body": b"x" * 65536, "more_body": True})
            sent.append(1)

    async def main() -> float:
        config = uvicorn.Config(endless, log_level="warning")
        config.load()
        state = ServerState()
        protocol = guarded_protocol(Limits(idle=0.5, read=5, max_connections=4, max_refusing=1))
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: protocol(config, state, {}), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.connect(("127.0.0.1", port))
        client.sendall(_request())  # and never reads
        start = time.monotonic()
        try:
            while state.tasks or not sent:  # the app's task ends once the sends stop blocking
                assert time.monotonic() - start < 20, f"still held after {len(sent)} sends"
                await asyncio.sleep(0.05)
            took = time.monotonic() - start
            client.settimeout(5)
            try:  # the server's side is gone: the client reads to an end
                while client.recv(1 << 20):
                    pass
            except ConnectionResetError:
                pass
        finally:
            client.close()
            server.close()
        return took

    assert 0.5 <= asyncio.run(main()) < 10
