"""The server's sampling (issue 41): a request's `min_p` (llama.cpp's and vLLM's field, which
OpenAI clients send in extra_body) is honoured and checked; a temperature whose division
overflows is greedy with real logprobs (it answered 200 with null logprobs); `serve --min-p`
and the other sampling flags set the requests' defaults, which GET /v1/inspect gives the page."""

from __future__ import annotations

import math

import pytest
from cli_refusal import fails
from serve_helpers import CONTEXT, InProcess, ServerProcess, call, reference

from sheepop.inference.load import load


@pytest.fixture(scope="module")
def served(runs):
    model = load(runs[1], engine="numpy")
    server = InProcess(model)
    yield model, server
    server.close()


def complete(server, **body):
    reply = call(server.url, "POST", "/v1/completions", {"prompt": "abc", "max_tokens": 16,
                                                        **body})
    return reply.status, reply.json()


def test_min_p_1_keeps_only_the_likeliest_token(served):
    model, server = served
    greedy = reference(model, model.tokenizer.encode("abc"), 16)
    for seed in (1, 2, 3):
        status, got = complete(server, temperature=1.8, min_p=1.0, seed=seed)
        assert status == 200 and got["choices"][0]["text"] == greedy
    hot = {complete(server, temperature=1.8, min_p=0.0, seed=s)[1]["choices"][0]["text"]
           for s in (1, 2, 3)}
    assert hot != {greedy}  # (without min-p the same seeds draw other tokens)


@pytest.mark.parametrize("value", [-0.1, 1.5, "0.2", True])
def test_min_p_out_of_range_is_a_400(served, value):
    status, got = complete(served[1], min_p=value)
    assert status == 400 and got["error"]["param"] == "min_p"
    assert "'min_p' must be a number in [0, 1]" in got["error"]["message"]


@pytest.mark.parametrize("tiny", [5e-324, 1e-308])
def test_a_temperature_whose_division_overflows_is_greedy_with_logprobs(served, tiny):
    model, server = served
    status, got = complete(server, temperature=0, logprobs=2)
    assert status == 200
    status, small = complete(server, temperature=tiny, logprobs=2)
    assert status == 200
    assert small["choices"][0]["text"] == got["choices"][0]["text"]
    mine, greedy = small["choices"][0]["logprobs"], got["choices"][0]["logprobs"]
    assert mine["tokens"] == greedy["tokens"]
    assert all(lp is not None and math.isfinite(lp) for lp in mine["token_logprobs"])
    assert mine["token_logprobs"] == greedy["token_logprobs"]  # the model's own p


def test_serve_flags_set_the_requests_defaults(runs, capsys):
    fails(capsys, ["serve", str(runs[1]), "--min-p", "2"], "sample.min_p must be in [0, 1]")
    server = ServerProcess(runs[1], "--engine", "numpy", "--min-p", "1", "--temperature", "1.7",
                           "--top-k", "7")
    try:
        shape = call(server.url, "GET", "/v1/inspect").json()
        assert shape["sampling"] == {"temperature": 1.7, "top_k": 7, "top_p": 0.95,
                                     "min_p": 1.0}
        model = load(runs[1], engine="numpy")
        greedy = reference(model, model.tokenizer.encode("abc"), 16)
        reply = call(server.url, "POST", "/v1/completions",
                     {"prompt": "abc", "max_tokens": 16, "seed": 5})  # min-p 1 by default
        assert reply.json()["choices"][0]["text"] == greedy
        assert CONTEXT == shape["context"]
    finally:
        assert server.stop() == 0
