"""Speculative decoding in the server (issue 45): a choice running alone checks the tokens
proposed from its prompt and output in one pass (sheepop.generation.speculative.check_pass on
the running batch's lone row). Greedy answers are the plain server's token for token, in both
engines, also under a schema; a sampled answer is valid and its usage consistent; the
proposals kept are counted in usage (`completion_tokens_details`), /health and the log; off
(the default, a request's 0, or more than one row running) nothing is proposed."""

from __future__ import annotations

import json
import signal

import jsonschema
import numpy as np
import pytest
from openai import OpenAI
from serve_helpers import InProcess, ServerProcess, call, reference, weights

from sheepop.config.schema import Config, ModelConfig
from sheepop.generation import speculative
from sheepop.inference.load import build
from sheepop.tokenizers import train_tokenizer
from sheepop.tokenizers.chat_format import with_chat_tokens

# Copy-heavy prompts of the tiny runs' alphabet (one token a character), 25-33 tokens: the
# answers repeat runs of them, or of themselves, which the lookup proposes.
PROMPTS = ["abc def ghi abc def ghi abc def g", "hij kab hij kab hij kab h",
           "ka.bj ka.bj ka.bj k", "a"]


@pytest.fixture
def gate_open(monkeypatch):
    """Proposals at every step (the gate never pauses): the most checks and rejections."""
    monkeypatch.setattr(speculative, "MIN_PAYOFF", 0.0)


def complete(url: str, **body) -> dict:
    r = call(url, "POST", "/v1/completions", body)
    assert r.status == 200, r.text
    return r.json()


def kept(usage: dict) -> tuple[int, int]:
    """(proposed, accepted) from a response's usage."""
    d = usage["completion_tokens_details"]
    return d["accepted_prediction_tokens"] + d["rejected_prediction_tokens"], \
        d["accepted_prediction_tokens"]


@pytest.mark.parametrize("which", ["chat_model", "plain_model"])  # torch sinusoidal, NumPy rope
def test_greedy_answers_with_speculation_are_the_plain_servers(which, request, gate_open):
    model = request.getfixturevalue(which)
    srv = InProcess(model, cache_mb=0)
    try:
        accepted = 0
        for prompt in PROMPTS:
            n = 64 - len(prompt)  # to the end of the context: the last pass has no room left
            spec = complete(srv.url, prompt=prompt, max_tokens=n, temperature=0, speculate=8,
                            logprobs=2)
            plain = complete(srv.url, prompt=prompt, max_tokens=n, temperature=0, logprobs=2)
            a, b = spec["choices"][0]["logprobs"], plain["choices"][0]["logprobs"]
            assert a["tokens"] == b["tokens"]  # token for token
            assert spec["choices"][0]["text"] == plain["choices"][0]["text"] == reference(
                model, model.tokenizer.encode(prompt), n)
            # the model's log-probabilities, read from a pass of k + 1 positions: float32
            # logits of order 10 from sums over 32-128 terms round differently by a few ulps
            np.testing.assert_allclose(a["token_logprobs"], b["token_logprobs"], atol=1e-4)
            proposed, accepted_here = kept(spec["usage"])
            assert 0 <= accepted_here <= proposed
            assert kept(plain["usage"]) == (0, 0)
            accepted += accepted_here
        assert accepted > 0
        health = call(srv.url, "GET", "/health").json()
        assert 0 < health["accepted_tokens"] == accepted <= health["proposed_tokens"]
    finally:
        srv.close()


def test_a_sampled_answer_is_valid_and_its_proposals_counted(chat_model, gate_open):
    srv = InProcess(chat_model, cache_mb=0)
    try:
        body = {"prompt": PROMPTS[1], "max_tokens": 39, "temperature": 1, "top_k": 0,
                "top_p": 1, "min_p": 0, "seed": 5, "speculate": 6, "logprobs": 1}
        one = complete(srv.url, **body)
        again = complete(srv.url, **body)
        choice, usage = one["choices"][0], one["usage"]
        assert choice["finish_reason"] in ("stop", "length")
        lp = choice["logprobs"]
        assert len(lp["tokens"]) == usage["completion_tokens"] <= 39
        # each token drawn where the model gives it probability > 0, and at T = 1 with no
        # filter what it was drawn from (q) is the model's own p, as without proposals
        q = [s["logprob"] for s in lp["sampled"]]
        assert all(np.isfinite(q))
        np.testing.assert_allclose(q, lp["token_logprobs"], atol=1e-6)
        proposed, accepted = kept(usage)
        assert proposed > 0 and 0 <= accepted <= proposed
        assert accepted < usage["completion_tokens"]  # a pass's first token is never a proposal
        assert again["choices"][0]["text"] == choice["text"] and kept(again["usage"]) == (
            proposed, accepted)  # the gate reads counts, never clocks: a seed gives one text
        chunks = call(srv.url, "POST", "/v1/completions",
                      {**body, "stream": True, "stream_options": {"include_usage": True}}
                      ).events()
        assert chunks[-1] == "[DONE]" and chunks[-2]["usage"] == usage
    finally:
        srv.close()


def test_off_nothing_is_proposed(chat_model, gate_open):
    """Off by default, by a request's 0, and for choices that share the batch (n = 2)."""
    srv = InProcess(chat_model, cache_mb=0)
    try:
        for body in ({}, {"speculate": 0}, {"speculate": 8, "n": 2}):
            r = complete(srv.url, prompt=PROMPTS[0], max_tokens=20, temperature=0, **body)
            assert kept(r["usage"]) == (0, 0)
            assert r["choices"][0]["text"] == reference(
                chat_model, chat_model.tokenizer.encode(PROMPTS[0]), 20)
        for bad in (-1, 65, 2.5, True):
            r = call(srv.url, "POST", "/v1/completions",
                     {"prompt": "a", "max_tokens": 2, "speculate": bad})
            assert r.status == 400 and r.json()["error"]["param"] == "speculate"
        assert call(srv.url, "GET", "/health").json()["proposed_tokens"] == 0
    finally:
        srv.close()


def test_the_flag_turns_it_on_and_the_log_says_what_was_kept(runs):
    server = ServerProcess(runs[1], "--engine", "numpy", "--speculate", "8")
    try:
        on = complete(server.url, prompt=PROMPTS[1], max_tokens=24, temperature=0)
        off = complete(server.url, prompt=PROMPTS[1], max_tokens=24, temperature=0,
                       speculate=0)
    finally:
        assert server.stop(signal.SIGTERM) == 0
    proposed, accepted = kept(on["usage"])
    assert accepted > 0 and kept(off["usage"]) == (0, 0)
    assert on["choices"][0]["text"] == off["choices"][0]["text"]
    lines = [line for line in server.lines if on["id"] in line]
    assert len(lines) == 1 and lines[0].endswith(
        f"; speculative decoding: {accepted} of {proposed} proposed tokens kept "
        f"({accepted / proposed:.0%}) in {lines[0].split(' in ')[-1]}")
    assert not any("speculative" in line for line in server.lines if off["id"] in line)


# ----- under a schema: each proposal is checked against the grammar's state ---------------------

POINTS = {"type": "array", "items": {
    "type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9},
                                     "y": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["x", "y"], "additionalProperties": False}, "minItems": 3, "maxItems": 3}


def test_answers_under_a_schema_with_speculation(gate_open):
    """Greedy: the plain server's answer; sampled hot: every answer validates. The prompt's
    JSON is proposed, and a proposal the grammar forbids is rejected like any other."""
    tok, _ = with_chat_tokens(train_tokenizer("char", ['{}[]":, 0123456789 xy\n']))
    cfg = Config()
    cfg.model = ModelConfig(vocab_size=tok.vocab_size, block_size=256, n_layer=1, n_head=2,
                            n_embd=32, tie_weights=False)
    srv = InProcess(build(cfg, weights(cfg.model), tok, "numpy", "cpu"), cache_mb=0)
    client = OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120)
    shape = {"type": "json_schema", "json_schema": {"name": "p", "schema": POINTS,
                                                    "strict": True}}
    prompt = '[{"x": 1, "y": 2}, {"x": 1, "y": 2}, {"x": 1, "y": 2}]\n' * 2
    try:
        answers = {}
        for speculate in (8, 0):
            r = client.completions.create(model="m", prompt=prompt, max_tokens=120,
                                          temperature=0, extra_body={
                                              "response_format": shape, "speculate": speculate})
            answers[speculate] = (r.choices[0].text, r.usage.completion_tokens_details)
        assert answers[8][0] == answers[0][0]
        jsonschema.validate(json.loads(answers[8][0]), POINTS)
        assert answers[8][1].accepted_prediction_tokens > 0
        assert answers[0][1].accepted_prediction_tokens == 0
        rejected = 0
        for seed in range(4):
            r = client.completions.create(model="m", prompt=prompt, max_tokens=120,
                                          temperature=1.5, seed=seed, extra_body={
                                              "response_format": shape, "speculate": 8})
            assert r.choices[0].finish_reason == "stop"
            jsonschema.validate(json.loads(r.choices[0].text), POINTS)
            rejected += r.usage.completion_tokens_details.rejected_prediction_tokens
        assert rejected > 0  # (proposals the model or the grammar turned down)
    finally:
        srv.close()
