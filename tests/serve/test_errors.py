"""Bad requests get OpenAI's error JSON with the right status, and the server keeps serving:
each one is followed by a request that succeeds. The API key on (the `server` fixture) and off
(`plain_server`, which also runs the NumPy engine and has no chat template)."""

from __future__ import annotations

import json
import socket

import pytest
from openai import AuthenticationError, BadRequestError, OpenAI
from serve_helpers import CONTEXT, KEY, call, reference

GOOD = {"prompt": "abc", "max_tokens": 5, "temperature": 0}


def _error(reply, status: int, param=None, code=None) -> dict:
    assert reply.status == status, reply.text
    assert reply.headers["content-type"] == "application/json"
    body = reply.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    err = body["error"]
    assert err["message"] and err["param"] == param and err["code"] == code
    return err


def _still_serves(url: str, key: str | None) -> None:
    ok = call(url, "POST", "/v1/completions", GOOD, key)
    assert ok.status == 200 and ok.json()["choices"][0]["finish_reason"] in ("length", "stop")


BAD_BODIES = [
    # (body, status, param, code)
    (b'{"prompt": "abc", "max_tokens": ', 400, None, None),               # malformed JSON
    (b"\xff\xfe not utf-8", 400, None, None),
    (b"[1, 2]", 400, None, None),                                        # not an object
    ({"prompt": 5}, 400, "prompt", None),                                # wrong types
    ({"prompt": [["a"]]}, 400, "prompt", None),
    ({"prompt": [10_000]}, 400, "prompt", None),                         # id outside the vocab
    ({"prompt": "abc", "max_tokens": "5"}, 400, "max_tokens", None),
    ({"prompt": "abc", "max_tokens": True}, 400, "max_tokens", None),
    ({"prompt": "abc", "max_tokens": 0}, 400, "max_tokens", None),       # below 1
    ({"prompt": "abc", "max_tokens": CONTEXT}, 400, "max_tokens",        # beyond what fits
     "context_length_exceeded"),
    ({"prompt": "a" * (CONTEXT + 1)}, 400, "prompt", "context_length_exceeded"),  # too long
    ({"prompt": "abc", "temperature": -1}, 400, "temperature", None),
    ({"prompt": "abc", "temperature": "hot"}, 400, "temperature", None),
    ({"prompt": "abc", "top_p": 0}, 400, "top_p", None),
    ({"prompt": "abc", "n": 0}, 400, "n", None),
    ({"prompt": "abc", "n": 9}, 400, "n", None),
    ({"prompt": "abc", "stop": 3}, 400, "stop", None),
    ({"prompt": "abc", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop", None),
    ({"prompt": "abc", "seed": 1.5}, 400, "seed", None),
    ({"prompt": "abc", "stream": "yes"}, 400, "stream", None),
    ({"prompt": "abc", "logprobs": 21}, 400, "logprobs", None),
    ({"prompt": "abc", "presence_penalty": 0.5}, 400, "presence_penalty", None),
    ({"prompt": "abc", "model": "gpt-4"}, 404, "model", "model_not_found"),  # unknown model
]


@pytest.mark.parametrize("body, status, param, code", BAD_BODIES,
                         ids=lambda v: json.dumps(v)[:40] if not isinstance(v, bytes) else None)
def test_a_bad_completion_request_is_refused_and_the_next_one_served(server, body, status,
                                                                      param, code):
    _error(call(server.url, "POST", "/v1/completions", body, KEY), status, param, code)
    _still_serves(server.url, KEY)


def test_bad_chat_requests(server):
    for body, param in [({"messages": "hi"}, "messages"),
                        ({"messages": []}, "messages"),
                        ({"messages": [{"role": "robot", "content": "x"}]}, "messages"),
                        ({"messages": [{"role": "user", "content": "<|end|>"}]}, "messages"),
                        ({"messages": [{"role": "user"}]}, "messages"),
                        ({"messages": [{"role": "user", "content": "a" * CONTEXT}]}, "messages"),
                        ({"messages": [{"role": "user", "content": "a"}], "top_logprobs": 2},
                         "top_logprobs")]:
        _error(call(server.url, "POST", "/v1/chat/completions", body, KEY), 400, param,
               "context_length_exceeded" if "a" * CONTEXT in json.dumps(body) else None)
        _still_serves(server.url, KEY)
    ok = call(server.url, "POST", "/v1/chat/completions", {
        "messages": [{"role": "developer", "content": "a"},
                     {"role": "user", "content": [{"type": "text", "text": "b"}]}],
        "max_tokens": 3}, KEY)
    assert ok.status == 200 and ok.json()["object"] == "chat.completion"


def test_a_body_over_the_limit_is_413(server):
    big = json.dumps({"prompt": "a", "padding": "x" * (1 << 20)})
    _error(call(server.url, "POST", "/v1/completions", big, KEY), 413, None, "request_too_large")
    _still_serves(server.url, KEY)


def test_unknown_routes_and_methods(server):
    _error(call(server.url, "GET", "/v1/nothing", None, KEY), 404, None, "not_found")
    _error(call(server.url, "GET", "/v1/completions", None, KEY), 405)
    _error(call(server.url, "GET", "/v1/models/other", None, KEY), 404, "model", "model_not_found")
    assert call(server.url, "GET", "/v1/models/chat", None, KEY).json()["id"] == "chat"
    _still_serves(server.url, KEY)


def test_with_an_api_key_every_request_but_health_needs_it(server):
    for key in (None, "sk-wrong", KEY + "x"):
        for method, path in (("POST", "/v1/completions"), ("GET", "/v1/models")):
            _error(call(server.url, method, path, GOOD if method == "POST" else None, key),
                   401, None, "invalid_api_key")
    health = call(server.url, "GET", "/health")
    assert health.status == 200 and health.json()["status"] == "ok"
    with pytest.raises(AuthenticationError):
        OpenAI(base_url=server.url + "/v1", api_key="sk-wrong", max_retries=0).models.list()
    _still_serves(server.url, KEY)


def test_without_an_api_key_none_is_needed(plain_server, plain_model):
    client = OpenAI(base_url=plain_server.url + "/v1", api_key="anything", max_retries=0)
    r = client.completions.create(model="plain", prompt="hig", max_tokens=30, temperature=0)
    ids = plain_model.tokenizer.encode("hig")
    assert r.choices[0].text == reference(plain_model, ids, 30)  # (the NumPy engine, rope)
    assert call(plain_server.url, "GET", "/v1/models").status == 200


def test_chat_without_a_chat_template_is_a_clear_400(plain_server):
    client = OpenAI(base_url=plain_server.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(BadRequestError) as e:
        client.chat.completions.create(model="plain", messages=[{"role": "user",
                                                                 "content": "a"}])
    assert e.value.status_code == 400 and "no chat template" in e.value.message
    assert e.value.code == "no_chat_template"
    _still_serves(plain_server.url, None)


def test_command_line_mistakes_are_one_line(runs, capsys):
    from sheepop.cli import main
    assert main(["serve", str(runs[1]), "--max-batch", "0"]) == 2
    assert capsys.readouterr().err == "sheepop: error: --max-batch must be at least 1\n"
    assert main(["serve", str(runs[1]), "--prefill-budget", "1"]) == 2
    assert capsys.readouterr().err == ("sheepop: error: --prefill-budget must be more than 1 "
                                       "(a step's time and some prompt)\n")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", str(runs[1]), "--port", str(port)]) == 2
    assert capsys.readouterr().err.startswith(f"sheepop: error: cannot listen on 127.0.0.1:{port}:")
    assert main(["serve", str(runs[1] / "nothing"), "--port", "0"]) == 2
    assert len(capsys.readouterr().err.splitlines()) == 1
