"""`response_format` (json_object, json_schema) and the `regex` extension through the official
`openai` client: every choice has the shape asked, also when requests with different schemas
share the running batch; what cannot be enforced is a 400 naming it, and the server goes on."""

from __future__ import annotations

import json
import re
import threading

import jsonschema
import openai
import pytest
from openai import OpenAI
from serve_helpers import InProcess, wait_until, weights

from sheepop.config.schema import Config, ModelConfig
from sheepop.inference.load import build
from sheepop.tokenizers import train_tokenizer
from sheepop.tokenizers.chat_format import with_chat_tokens

PERSON = {"type": "object", "properties": {
    "id": {"type": "integer", "minimum": 0, "maximum": 99},
    "tag": {"enum": ["red", "blue"]},
    "codes": {"type": "array", "items": {"type": "string", "pattern": "^[a-f]{1,3}$"},
              "minItems": 1, "maxItems": 3},
    "inner": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}},
    "required": ["id", "tag", "codes", "inner"], "additionalProperties": False}
POINT = {"type": "object", "properties": {"x": {"type": "integer", "minimum": -9, "maximum": 9},
                                          "y": {"type": "integer", "minimum": -9, "maximum": 9}},
         "required": ["x", "y"], "additionalProperties": False}
HOT = {"temperature": 1.5, "max_tokens": 200, "seed": 11}


@pytest.fixture(scope="module")
def server():
    """A random model over every character of JSON, with the chat tokens (hot, its free text is
    noise), served in this process, batches of up to 8."""
    tok, _ = with_chat_tokens(train_tokenizer("char", ['{}[]":, 0123456789 abcdefghijklmnop'
                                                       'qrstuvwxyz-.\n']))
    cfg = Config()
    cfg.model = ModelConfig(vocab_size=tok.vocab_size, block_size=256, n_layer=1, n_head=2,
                            n_embd=32, tie_weights=False)
    s = InProcess(build(cfg, weights(cfg.model), tok, "numpy", "cpu"), max_batch=8)
    yield s
    s.close()


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)


def schema_format(schema: dict, **more) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "s", "schema": schema, "strict": True,
                                                   **more}}


def test_every_chat_choice_validates_against_the_schema(client):
    r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                       n=6, response_format=schema_format(PERSON), **HOT)
    for choice in r.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), PERSON)
    free = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                          **HOT)
    with pytest.raises(ValueError):  # the model alone writes no JSON
        json.loads(free.choices[0].message.content)


def test_json_object_and_a_regex_in_completions(client):
    r = client.completions.create(model="m", prompt="ab", n=4, temperature=0.8, max_tokens=200,
                                  seed=3, extra_body={"response_format": {"type": "json_object"}})
    for choice in r.choices:
        if choice.finish_reason == "stop":  # ("length": cut, a valid beginning only)
            assert isinstance(json.loads(choice.text), dict)
    assert any(c.finish_reason == "stop" for c in r.choices)
    r = client.completions.create(model="m", prompt="ab", n=4,
                                  extra_body={"regex": "[0-9]{2}-[a-c]+"}, **HOT)
    for choice in r.choices:
        assert re.fullmatch("[0-9]{2}-[a-c]+", choice.text) and choice.finish_reason == "stop"


def test_rows_with_different_schemas_share_the_batch(server, client):
    """Three requests held until all are queued, then run in one batch: each follows its own."""
    asks = [("json_schema", PERSON), ("json_schema", POINT), ("regex", "[a-f]{4}")]
    answers: list = [None] * len(asks)

    def ask(i: int) -> None:
        kind, what = asks[i]
        extra = ({"response_format": schema_format(what)} if kind == "json_schema"
                 else {"regex": what})
        answers[i] = client.completions.create(model="m", prompt="ab", n=2, extra_body=extra,
                                               **HOT)

    release = server.hold()
    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(asks))]
    for t in threads:
        t.start()
    wait_until(lambda: len(server.scheduler.waiting) == 2 * len(asks), "the three requests")
    release.set()
    for t in threads:
        t.join(120)
    people, points, letters = answers
    for c in people.choices:
        jsonschema.validate(json.loads(c.text), PERSON)
    for c in points.choices:
        jsonschema.validate(json.loads(c.text), POINT)
    assert all(re.fullmatch("[a-f]{4}", c.text) for c in letters.choices)


@pytest.mark.parametrize("body, param, said", [
    ({"response_format": schema_format({"type": "array", "uniqueItems": True})},
     "response_format", "uniqueItems"),
    ({"response_format": schema_format({"type": "integer", "not": {"const": 3}})},
     "response_format", "not"),
    ({"response_format": schema_format(POINT, strict=False)}, "response_format", "strict"),
    ({"response_format": {"type": "xml"}}, "response_format", "json_schema"),
    ({"response_format": {"type": "json_schema"}}, "response_format", "'schema' object"),
    ({"regex": "(ab"}, "regex", "cannot be enforced"),
    ({"regex": "a+", "response_format": {"type": "json_object"}}, "regex", "both"),
    ({"response_format": {"type": "json_object"}, "ignore_eos": True}, "response_format",
     "ignore_eos"),
])
def test_what_cannot_be_enforced_is_a_400_naming_it(client, body, param, said):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}],
                                       max_tokens=5, extra_body=body)
    error = e.value.body
    assert e.value.status_code == 400 and error["param"] == param, error
    assert said in error["message"], error
    r = client.completions.create(model="m", prompt="ab", max_tokens=3)  # it goes on serving
    assert r.choices[0].finish_reason in ("stop", "length")
