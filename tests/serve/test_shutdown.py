"""Graceful shutdown: on SIGTERM or SIGINT `sheepop serve` lets the running streams finish, then
exits 0; past its deadline it cancels what is still running (their rows leave the batch)."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import time

import pytest
from serve_helpers import BOUND_S, CONTEXT, InProcess, Reply, ServerProcess, wait_until


def _open_stream(url: str, body: dict) -> tuple[http.client.HTTPConnection, object]:
    conn = http.client.HTTPConnection(*url[len("http://"):].split(":"), timeout=BOUND_S)
    conn.request("POST", "/v1/completions", json.dumps(body),
                 {"Content-Type": "application/json"})
    return conn, conn.getresponse()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_lets_a_running_stream_finish_and_exits_0(runs, signum):
    srv = ServerProcess(runs[1], "--engine", "numpy", "--shutdown-timeout", str(BOUND_S))
    n = CONTEXT - 3
    conn, reply = _open_stream(srv.url, {"prompt": "abc", "max_tokens": n, "temperature": 0,
                                         "stream": True, "ignore_eos": True})
    first = reply.readline()
    assert first.startswith(b"data: {")
    srv.proc.send_signal(signum)
    rest = Reply(200, {}, (first + reply.read()).decode()).events()
    conn.close()
    assert srv.proc.wait(BOUND_S) == 0
    assert rest[-1] == "[DONE]" and len(rest) == n + 1  # every token, then the end
    assert rest[-2]["choices"][0]["finish_reason"] == "length"
    log = "".join(srv.lines)
    assert "Traceback" not in log and log.endswith("sheepop: server stopped\n")


def test_past_the_deadline_running_requests_are_cancelled(chat_model):
    srv = InProcess(chat_model, shutdown_timeout=0.2, max_batch=2)
    held, release = srv.hold_after_step(2)
    conn, reply = _open_stream(srv.url, {"prompt": "a", "max_tokens": 50, "stream": True})
    held.wait(BOUND_S)
    choice = srv.scheduler.running[0]
    srv.server.should_exit = True  # (what SIGTERM does)
    wait_until(lambda: choice.job.cancelled is not None, "the request cancelled")
    release.set()
    events = Reply(200, {}, reply.read().decode()).events()
    conn.close()
    srv.thread.join(BOUND_S)
    assert not srv.thread.is_alive() and not srv.scheduler.thread.is_alive()
    assert choice.generated == 3  # cancelled, not run to 50 tokens
    assert events[-2]["error"]["code"] == "shutting_down" and events[-1] == "[DONE]"
    assert len(events) == 3 + 2  # its 3 tokens, then the reason it stopped


def test_a_body_still_arriving_at_the_deadline_gets_503_shutting_down(runs):
    """A request whose body had not all arrived when the graceful stop's deadline passed: 503
    `shutting_down` as JSON, the server exits 0 with no traceback (it answered a plain-text 500
    and logged the cancellation's traceback)."""
    srv = ServerProcess(runs[1], "--engine", "numpy", "--shutdown-timeout", "0.5")
    host, port = srv.url[len("http://"):].split(":")
    with socket.create_connection((host, int(port)), timeout=BOUND_S) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                     b"application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\": \"hi\"")
        time.sleep(0.5)  # (the headers reach the app at once; its body never completes)
        srv.proc.send_signal(signal.SIGTERM)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.decode().partition("\r\n\r\n")
    assert head.startswith("HTTP/1.1 503"), answer
    assert json.loads(body)["error"]["code"] == "shutting_down"
    assert srv.proc.wait(BOUND_S) == 0
    log = "".join(srv.lines)
    assert "Traceback" not in log and log.endswith("sheepop: server stopped\n"), log
