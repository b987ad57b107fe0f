"""Continuous batching through the server: 16 concurrent streams equal the same requests run one
at a time; requests join a running batch; a client that disconnects frees its row; a full queue
answers 503 with Retry-After; a request past its timeout gets 504.

The first test runs against the `sheepop serve` subprocess. The others need to stop the
scheduler at a known point (so that what they check does not depend on timing): they run the
same app under uvicorn in this process (`InProcess`), whose scheduler they can hold."""

from __future__ import annotations

import http.client
import json
import threading
import time

import pytest
from openai import OpenAI
from serve_helpers import KEY, InProcess, call, reference, wait_until

from sheepop.tokenizers.chat_format import chat_ids

PROMPTS = ["a", "bc", "hig fed", "k.k", "abcdefgh", "  ", "ji", "e\ne", "dcba", "g",
           "fff", "hk", "c a b", "ijk.", "b", "gaga"]


def _requests():
    """16 different greedy requests: prompts of 1 to 8 tokens, 5 to 50 new tokens, half
    streamed completions and half streamed chats."""
    return [(p, 5 + 3 * i, i % 2 == 1) for i, p in enumerate(PROMPTS)]


def _stream(client: OpenAI, prompt: str, max_tokens: int, chat: bool) -> tuple[str, str]:
    if chat:
        chunks = client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": prompt}],
            max_tokens=max_tokens, temperature=0, stream=True)
        parts = [(c.choices[0].delta.content or "", c.choices[0].finish_reason)
                 for c in chunks]
    else:
        chunks = client.completions.create(model="chat", prompt=prompt, max_tokens=max_tokens,
                                           temperature=0, stream=True)
        parts = [(c.choices[0].text, c.choices[0].finish_reason) for c in chunks]
    return "".join(p for p, _ in parts), [f for _, f in parts if f][-1]


def test_16_concurrent_streams_equal_the_same_requests_one_at_a_time(server, chat_model):
    client = OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120)
    alone = [_stream(client, *r) for r in _requests()]
    together: list = [None] * len(alone)

    def one(i: int, r) -> None:
        together[i] = _stream(client, *r)

    threads = [threading.Thread(target=one, args=(i, r)) for i, r in enumerate(_requests())]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert together == alone
    tok = chat_model.tokenizer
    for (prompt, n, chat), (text, _) in zip(_requests(), alone):  # and sheepop's own loop
        ids = chat_ids(tok, [{"role": "user", "content": prompt}], True)[0] if chat \
            else tok.encode(prompt)
        assert text == reference(chat_model, ids, n, chat=chat)


@pytest.fixture
def inprocess(chat_model):
    servers = []

    def start(**settings) -> InProcess:
        servers.append(InProcess(chat_model, **settings))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def _background(url: str, body: dict) -> tuple[threading.Thread, list]:
    out: list = []
    t = threading.Thread(target=lambda: out.append(call(url, "POST", "/v1/completions", body)))
    t.start()
    return t, out


def test_requests_join_a_running_batch_and_get_their_own_tokens(inprocess, chat_model):
    srv = inprocess(max_batch=16)
    first = [(p, 40) for p in PROMPTS[:8]]
    later = [(p, 20) for p in PROMPTS[8:]]
    release = srv.hold()
    jobs = [_background(srv.url, {"prompt": p, "max_tokens": n, "temperature": 0})
            for p, n in first]
    wait_until(lambda: srv.scheduler.status()["waiting"] == 8, "8 waiting requests")
    held, go_on = srv.hold_after_step(5)
    release.set()  # the first 8 join together and decode 5 steps
    held.wait(60)
    assert srv.scheduler.status()["running"] == 8
    jobs += [_background(srv.url, {"prompt": p, "max_tokens": n, "temperature": 0})
             for p, n in later]
    wait_until(lambda: srv.scheduler.status()["waiting"] == 8, "8 more waiting")
    go_on.set()  # the next 8 join the running batch at its next step
    for t, _ in jobs:
        t.join(120)
    tok = chat_model.tokenizer
    for (p, n), (_, out) in zip(first + later, jobs):
        assert out[0].status == 200
        assert out[0].json()["choices"][0]["text"] == reference(chat_model, tok.encode(p), n)
    assert srv.scheduler.status()["peak_running"] == 16


def test_a_client_that_disconnects_frees_its_row_at_once(inprocess):
    srv = inprocess(max_batch=4)
    held, release = srv.hold_after_step(3)
    conn = http.client.HTTPConnection(*srv.url[len("http://"):].split(":"), timeout=60)
    conn.request("POST", "/v1/completions", json.dumps(
        {"prompt": "ab", "max_tokens": 60, "temperature": 0, "stream": True}),
        {"Content-Type": "application/json"})
    reply = conn.getresponse()
    assert reply.status == 200 and reply.readline().startswith(b"data: {")  # mid-stream
    held.wait(60)
    choice = srv.scheduler.running[0]
    conn.sock.close()  # the client goes away
    conn.close()
    wait_until(lambda: choice.job.cancelled == "disconnected", "the disconnection noticed")
    release.set()
    wait_until(lambda: srv.scheduler.status()["running"] == 0, "the row freed")
    assert choice.generated == 4 and srv.scheduler.status()["cancelled"] == 1  # not 60
    assert call(srv.url, "POST", "/v1/completions", {"prompt": "a", "max_tokens": 3}).status \
        == 200


def test_a_full_queue_answers_503_with_retry_after(inprocess):
    srv = inprocess(max_batch=1, max_queue=2)
    release = srv.hold()
    body = {"prompt": "a", "max_tokens": 5, "temperature": 0}
    jobs = [_background(srv.url, body) for _ in range(2)]
    wait_until(lambda: srv.scheduler.status()["waiting"] == 2, "a full queue")
    full = call(srv.url, "POST", "/v1/completions", body)
    assert full.status == 503 and full.headers["retry-after"] == "1"
    assert full.json()["error"]["code"] == "queue_full"
    release.set()
    for t, out in jobs:
        t.join(60)
        assert out[0].status == 200
    assert call(srv.url, "POST", "/v1/completions", body).status == 200


def test_a_request_past_its_timeout_gets_504_and_a_stream_an_error_event(inprocess):
    srv = inprocess(max_batch=2, timeout=1.0)
    release = srv.hold()
    t, out = _background(srv.url, {"prompt": "a", "max_tokens": 5})
    wait_until(lambda: srv.scheduler.status()["waiting"] == 1, "a waiting request")
    job = srv.scheduler.waiting[0].job
    wait_until(lambda: time.monotonic() > job.deadline, "its deadline passed")
    release.set()
    t.join(60)
    assert out[0].status == 504 and out[0].json()["error"]["code"] == "timeout"

    held, release = srv.hold_after_step(2)
    t, out = _background(srv.url, {"prompt": "a", "max_tokens": 50, "stream": True})
    held.wait(60)
    job = srv.scheduler.running[0].job
    wait_until(lambda: time.monotonic() > job.deadline, "its deadline passed")
    release.set()
    t.join(60)
    events = out[0].events()
    assert out[0].status == 200 and events[-1] == "[DONE]"
    assert events[-2]["error"]["code"] == "timeout" and len(events) == 2 + 3  # 3 tokens first
    assert srv.scheduler.status()["running"] == 0
