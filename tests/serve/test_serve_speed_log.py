"""The server logs one line per request answered (issue 41, section 4): its prompt and generated
tokens, exactly as the response's usage counts them, tokens/s and the time to first token, each
rate the quotient of the figures printed beside it (tests/helpers/speed_line.py)."""

from __future__ import annotations

import time

import pytest
from serve_helpers import BOUND_S, KEY, call
from speed_line import check_speed


def logged(server, request_id: str) -> list[str]:
    """The server's log lines about `request_id`, once there is one (it follows the answer)."""
    deadline = time.monotonic() + BOUND_S
    while time.monotonic() < deadline:
        lines = [line for line in list(server.lines) if f"sheepop: {request_id}: " in line]
        if lines:
            time.sleep(0.2)  # (a second line would be a mistake: give it the time to show)
            return [line for line in list(server.lines) if f"sheepop: {request_id}: " in line]
        time.sleep(0.05)
    return []


@pytest.mark.parametrize("body", [
    {"prompt": "abc ab", "max_tokens": 9, "temperature": 0},
    {"prompt": ["abc", "ba"], "max_tokens": 7, "n": 2, "seed": 1},
])
def test_each_completion_logs_its_tokens_and_speed(plain_server, body):
    r = call(plain_server.url, "POST", "/v1/completions", body)
    assert r.status == 200, r.text
    answer = r.json()
    lines = logged(plain_server, answer["id"])
    assert len(lines) == 1, plain_server.lines[-5:]
    usage = answer["usage"]
    check_speed(lines[0], prompt=usage["prompt_tokens"], generated=usage["completion_tokens"])


def test_a_streamed_chat_logs_its_tokens_and_speed(server):
    body = {"messages": [{"role": "user", "content": "abc"}], "max_tokens": 6,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    r = call(server.url, "POST", "/v1/chat/completions", body, key=KEY)
    assert r.status == 200, r.text
    events = r.events()
    usage = events[-2]["usage"]
    lines = logged(server, events[-2]["id"])
    assert len(lines) == 1, server.lines[-5:]
    check_speed(lines[0], prompt=usage["prompt_tokens"], generated=usage["completion_tokens"])


def test_tokens_are_timed_when_drawn_not_when_the_response_takes_them():
    """The model's thread may draw several tokens before the response's coroutine takes their
    events (seen: 3 tokens taken together, "the 2 after the first in 0.00 ms"): each is timed
    by its event's own time."""
    from sheepop.generation.speed import Stopwatch
    from sheepop.serve.api.choice import Event

    watch = Stopwatch(prompt_tokens=6)
    events = []
    for token in (5, 7, 9):
        events.append(Event(0, token=token))
        time.sleep(0.01)  # one decode step
    for e in events:  # taken together, later
        watch.tick(e.at)
    speed = watch.speed()
    assert speed.generated == 3
    assert speed.rest_s == events[-1].at - events[0].at >= 0.02
    assert speed.first_s == events[0].at - watch.start
