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
from sheepop.serve.api.joining import MIN_CHUNK, MIN_STALL_S, WHOLE, Joining


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


def test_a_stream_keeps_getting_tokens_while_a_long_prompt_joins(chat_model):
    """A 40-token prompt joins 2 tokens at a time: 20 iterations, each with a decode step of
    the stream already running, which gets a token in each (whole prefill: none)."""
    srv = InProcess(chat_model, prefill_chunk=2, cache_mb=0)
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
        stream = send("stream", {"prompt": "a", "max_tokens": 60, "temperature": 0})
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
    tok = chat_model.tokenizer
    assert out["long"].json()["choices"][0]["text"] == reference(
        chat_model, tok.encode(long_prompt), 3)
    assert out["stream"].json()["choices"][0]["text"] == reference(chat_model, tok.encode("a"), 60)


def test_the_chunk_is_a_decode_steps_worth_of_prompt_and_whole_when_nothing_runs(chat_model):
    auto, fixed = (Joining(chat_model.lm, PrefixCache(0), chunk) for chunk in (0, 7))
    assert auto.budget(running=False) == fixed.budget(running=False) == WHOLE
    assert fixed.budget(running=True) == 7
    auto.measured(step_s=0.5)
    auto.spent = 50
    auto.measured(prefill_s=0.25)  # 5 ms a token: a 0.5 s step is worth 100 tokens
    assert auto.budget(running=True) == 100
    auto.measured(step_s=0.02)  # moving average: 0.7 * 0.5 + 0.3 * 0.02 = 0.356 s
    assert auto.budget(running=True) == 71
    auto.step_s = 0.001  # quicker than MIN_STALL_S: 0.1 s of prompt, 20 tokens
    assert auto.budget(running=True) == round(MIN_STALL_S / 0.005) == 20
    auto.token_s = 0.05
    assert auto.budget(running=True) == MIN_CHUNK
