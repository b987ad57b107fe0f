"""Prompt reuse and chunked prefill through the server: `usage.prompt_tokens_details.
cached_tokens` through the official `openai` client in both engines, the prefix cache's figures
in /health, and a running stream that keeps getting tokens while a long prompt joins (checked by
the order of the scheduler's deliveries, never by time)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from openai import OpenAI
from serve_helpers import KEY, InProcess, call, reference, wait_until

from sheepop.generation.prefix_cache import BLOCK_TOKENS, PrefixCache
from sheepop.serve.api.joining import (
    FIRST_CHUNK,
    GROWTH,
    MIN_CHUNK,
    REMEASURE,
    WHOLE,
    Joining,
)


def _text(seed: int, n: int) -> str:
    """n characters of the tiny runs' alphabet (one token each), unlike any other test's."""
    alphabet = "abcdefgh ijk."
    return "".join(alphabet[i] for i in np.random.default_rng(seed).integers(0, 13, size=n))


@pytest.mark.parametrize("which", ["server", "plain_server"])  # torch engine, NumPy engine
def test_cached_tokens_count_the_whole_blocks_an_earlier_request_left(which, request):
    srv = request.getfixturevalue(which)
    client = OpenAI(base_url=srv.url + "/v1", api_key=KEY, max_retries=0, timeout=120)
    name = client.models.list().data[0].id
    first, more = _text(100, 40), _text(101, 15)  # 40 tokens: 2 whole blocks
    r1 = client.completions.create(model=name, prompt=first, max_tokens=1, temperature=0)
    assert r1.usage.prompt_tokens == 40 and r1.usage.prompt_tokens_details.cached_tokens == 0
    r2 = client.completions.create(model=name, prompt=first + more, max_tokens=4, temperature=0)
    assert r2.usage.prompt_tokens_details.cached_tokens == 2 * BLOCK_TOKENS
    # the same 55 tokens again, streamed: 3 whole blocks of its own (never its last token)
    chunks = list(client.completions.create(
        model=name, prompt=first + more, max_tokens=4, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 3 * BLOCK_TOKENS
    assert "".join(c.choices[0].text for c in chunks if c.choices) == r2.choices[0].text
    health = call(srv.url, "GET", "/health").json()
    assert health["prefix_cache_max_bytes"] == 1024 * 2**20
    assert 0 < health["prefix_cache_bytes"] <= health["prefix_cache_max_bytes"]
    assert health["cached_tokens"] >= 5 * BLOCK_TOKENS


def test_no_cache_reports_no_cached_token(chat_model):
    srv = InProcess(chat_model, cache_mb=0)
    try:
        for _ in range(2):
            r = call(srv.url, "POST", "/v1/completions",
                     {"prompt": _text(102, 40), "max_tokens": 2, "temperature": 0}).json()
            assert r["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
        assert call(srv.url, "GET", "/health").json()["prefix_cache_bytes"] == 0
    finally:
        srv.close()


@pytest.mark.parametrize("which", ["chat_model", "plain_model"])  # torch engine, NumPy engine
def test_a_stream_keeps_getting_tokens_while_a_long_prompt_joins(which, request):
    """A 40-token prompt joins 2 tokens at a time: 20 iterations, each one forward pass with
    the decode step of the stream already running, which gets a token in each (whole prefill:
    none)."""
    model = request.getfixturevalue(which)
    srv = InProcess(model, prefill_chunk=2, cache_mb=0)
    s = srv.scheduler
    log: list[tuple[int, bool]] = []  # (request, whether it is a token) in delivery order
    jobs: dict[object, int] = {}
    deliver = s.deliver

    def recorded(batch):
        for job, events in batch:
            who = jobs.setdefault(job, len(jobs))
            log.extend((who, e.token is not None) for e in events)
        deliver(batch)

    s.deliver = recorded
    out: dict[str, object] = {}

    def send(name: str, body: dict) -> threading.Thread:
        t = threading.Thread(target=lambda: out.__setitem__(
            name, call(srv.url, "POST", "/v1/completions", body)))
        t.start()
        return t

    try:
        held, release = srv.hold_after_step(1)
        # ("d": a prompt neither model ends within 60 greedy tokens)
        stream = send("stream", {"prompt": "d", "max_tokens": 60, "temperature": 0})
        held.wait(60)  # the stream has 2 tokens, 58 to come
        long_prompt = _text(103, 40)
        joining = send("long", {"prompt": long_prompt, "max_tokens": 3, "temperature": 0})
        wait_until(lambda: s.status()["waiting"] == 1, "the long prompt waiting")
        mark = len(log)
        release.set()
        stream.join(120)
        joining.join(120)
    finally:
        srv.close()
    first_of_long = next(i for i, (who, _) in enumerate(log) if who == 1)
    assert first_of_long > mark
    during = sum(1 for who, token in log[mark:first_of_long] if who == 0 and token)
    assert during >= 40 // 2 - 1, log[mark:first_of_long]
    assert s.status()["mixed_steps"] >= 40 // 2  # each chunk in the stream's step's pass
    tok = model.tokenizer
    assert out["long"].json()["choices"][0]["text"] == reference(
        model, tok.encode(long_prompt), 3)
    assert out["stream"].json()["choices"][0]["text"] == reference(model, tok.encode("d"), 60)


def test_the_chunk_keeps_an_iteration_within_the_budget_and_is_whole_when_nothing_runs(
        chat_model):
    auto, fixed = (Joining(chat_model.lm, PrefixCache(0), chunk, ratio=2) for chunk in (0, 7))
    assert auto.budget(running=False) == fixed.budget(running=False) == WHOLE
    assert fixed.budget(running=True) == fixed.budget(running=True, mixed=True) == 7
    assert auto.budget(running=True) == FIRST_CHUNK  # nothing measured yet
    auto.spent = FIRST_CHUNK
    auto.measured(iteration_s=0.5)  # no step measured: no target yet
    assert auto.budget(running=True) == FIRST_CHUNK
    auto.measured(step_s=0.5)  # the target: 2 x 0.5 s, 0.5 s of it for the prompt
    auto.measured(iteration_s=0.5)  # no slower than a step: nothing learnt of b
    assert auto.budget(running=True) == FIRST_CHUNK
    auto.measured(iteration_s=0.66)  # b = 0.16 s / 32 = 5 ms: C* = 100, at most x GROWTH
    assert auto.budget(running=True) == int(FIRST_CHUNK * GROWTH) == 40
    auto.spent = 40
    auto.measured(iteration_s=1.3)  # b = 20 ms; the median of 5 and 20 ms: C* = 40
    assert auto.budget(running=True) == 40
    auto.measured(iteration_s=1.3)  # the median 20 ms: C* = 25, reached at once
    assert auto.budget(running=True) == 25
    auto.spent = 3  # a prompt's last 3 tokens, quickly (b = 10 ms): the median still 20 ms ...
    auto.measured(iteration_s=0.53)
    assert auto.budget(running=True, mixed=True) == 25
    auto.spent = 25
    auto.measured(iteration_s=30.0)  # one slow iteration in three: the median is 20 ms
    assert auto.budget(running=True, mixed=True) == 25
    auto.measured(iteration_s=30.0)  # two: b 1.18 s, C* < 1: x SHRINK
    assert auto.budget(running=True, mixed=True) == 12
    for _ in range(3):
        auto.measured(iteration_s=30.0)  # 6.2, 3.1, 1.6 tokens
    assert auto.budget(running=True, mixed=True) == 1  # a mixed pass: at least 1 token
    assert auto.budget(running=True) == MIN_CHUNK  # a pass of its own: at least MIN_CHUNK
    grows = Joining(chat_model.lm, PrefixCache(0), 0, ratio=2)
    grows.measured(step_s=0.5)
    grows.spent = 3  # a prompt's last 3 tokens: b = 10 ms, C* = 50, but no growth from a
    grows.measured(iteration_s=0.53)  # chunk it did not fill
    assert grows.budget(running=True) == FIRST_CHUNK
    half = Joining(chat_model.lm, PrefixCache(0), 0, ratio=1.5)
    half.measured(step_s=0.4)
    half.spent = FIRST_CHUNK
    half.measured(iteration_s=0.5)  # 1.5 x 0.4 s = 0.6 s: b = 3.125 ms, C* = 64: x GROWTH
    assert half.budget(running=True) == 40
    half.spent = 40
    half.measured(iteration_s=0.9)  # b = 12.5 ms: median(3.125, 12.5) = 7.8 ms, C* = 25.6
    assert half.budget(running=True) == 25
    # the step it is sized against was measured at about as many running rows
    rows = Joining(chat_model.lm, PrefixCache(0), 0)
    assert fixed.ready(15) and not rows.ready(15)
    rows.measured(step_s=0.2, rows=1)
    assert rows.ready(2) and not rows.ready(3)  # within a quarter, or one row
    rows.measured(step_s=1.0, rows=12)  # another number of rows: the average starts again
    assert rows.step_s == 1.0 and rows.ready(15) and not rows.ready(16)
    rows.measured(step_s=0.5, rows=15)  # about as many: the median of the last ones
    rows.measured(step_s=9.0, rows=15)  # (one slow step moves it by one place, not by 9 s)
    assert rows.step_s == 1.0
    rows.spent = 10
    for _ in range(REMEASURE):  # and within the last few iterations with prompt tokens
        assert rows.ready(15)
        rows.measured(iteration_s=1.0)
    assert not rows.ready(15)
    rows.measured(step_s=0.8, rows=15)
    assert rows.ready(15) and rows.step_s == pytest.approx(0.9)  # (1.0, 0.5, 9.0, 0.8)
    quick = Joining(chat_model.lm, PrefixCache(0), 0)
    quick.measured(step_s=0.001)  # quicker than MIN_STALL_S: 0.1 s of prompt a step
    quick.spent = FIRST_CHUNK
    quick.measured(iteration_s=0.202)  # the target 0.101 s: half
    assert quick.budget(running=True) == FIRST_CHUNK // 2
