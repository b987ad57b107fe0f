"""`sheepop serve` through the official `openai` client: completions and chats, whole and
streamed, log-probabilities, stop strings, n > 1 with seeds, each equal to what sheepop's own
generation loop writes for the same prompt and settings."""

from __future__ import annotations

import numpy as np
import pytest
from openai import OpenAI
from serve_helpers import KEY, call, reference

from sheepop.generation.generate import generate
from sheepop.serve.api.choice import log_softmax
from sheepop.tokenizers.chat_format import chat_ids

MESSAGES = [{"role": "system", "content": "abc"}, {"role": "user", "content": "hig fed"}]


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120)


def test_a_completion_is_sheepops_own_greedy_generation(client, chat_model):
    tok = chat_model.tokenizer
    r = client.completions.create(model="chat", prompt="abc d", max_tokens=20, temperature=0)
    ids = tok.encode("abc d")
    assert r.choices[0].text == reference(chat_model, ids, 20)
    tokens = [s.token for s in generate(chat_model.lm, ids, _greedy(20), eos_id=tok.eos_id)]
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == len(tokens)
    assert r.usage.total_tokens == len(ids) + len(tokens)
    assert r.choices[0].finish_reason == ("stop" if tokens[-1] == tok.eos_id else "length")
    assert r.model == "chat" and r.object == "text_completion" and r.id.startswith("cmpl-")
    models = client.models.list()
    assert [m.id for m in models.data] == ["chat"]


def _greedy(n: int):
    from sheepop.config.schema import SampleConfig
    return SampleConfig(temperature=0, max_new_tokens=n)


def test_a_chat_answer_follows_the_chat_template(client, chat_model):
    r = client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=12,
                                       temperature=0)
    ids, _ = chat_ids(chat_model.tokenizer, MESSAGES, add_generation_prompt=True)
    expected = reference(chat_model, ids, 12, chat=True)
    assert r.choices[0].message.content == expected and r.choices[0].message.role == "assistant"
    assert r.usage.prompt_tokens == len(ids)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")


def test_streams_carry_the_same_text_and_end_in_done(client, server, chat_model):
    whole = client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=30,
                                           temperature=0)
    chunks = list(client.chat.completions.create(
        model="chat", messages=MESSAGES, max_tokens=30, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == \
        whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage  # (asked for)
    raw = call(server.url, "POST", "/v1/completions", {"prompt": "fed", "max_tokens": 25,
                                                       "temperature": 0, "stream": True}, KEY)
    assert raw.status == 200 and raw.headers["content-type"].startswith("text/event-stream")
    events = raw.events()
    assert events[-1] == "[DONE]" and raw.text.endswith("data: [DONE]\n\n")
    ids = chat_model.tokenizer.encode("fed")
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == \
        reference(chat_model, ids, 25)
    assert all(e["object"] == "text_completion" for e in events[:-1])


def test_logprobs_are_the_models_own(client, chat_model):
    tok, lm = chat_model.tokenizer, chat_model.lm
    never = lm.never_generate
    r = client.completions.create(model="chat", prompt="gh", max_tokens=8, temperature=0,
                                  logprobs=3, echo=True)
    lp = r.choices[0].logprobs
    ids = tok.encode("gh")
    new = [s.token for s in generate(lm, ids, _greedy(8), eos_id=tok.eos_id)]
    shown = [t for t in new if t != tok.eos_id]
    assert lp.tokens == [tok.decode([t]) for t in ids + shown]
    assert r.choices[0].text == "gh" + reference(chat_model, ids, 8)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None  # nothing predicts it
    for t in range(1, len(ids) + len(shown)):
        seq = (ids + new)[:t]
        expected = log_softmax(lm.full(seq), never)
        assert lp.token_logprobs[t] == pytest.approx(expected[(ids + new)[t]], abs=1e-5)
        top = sorted(range(len(expected)), key=lambda i: -expected[i])[:3]
        assert list(lp.top_logprobs[t]) == [tok.decode([i]) for i in top]
    assert lp.text_offset == list(np.cumsum([0] + [len(s) for s in lp.tokens[:-1]]))

    c = client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=6,
                                       temperature=0, logprobs=True, top_logprobs=2)
    content = c.choices[0].logprobs.content
    assert "".join(e.token for e in content) == c.choices[0].message.content
    for e in content:
        assert len(e.top_logprobs) == 2 and e.top_logprobs[0].logprob == e.logprob
        assert bytes(e.bytes) == e.token.encode() and e.logprob <= 0


def test_a_stop_string_cuts_the_text_before_it(client, chat_model):
    ids = chat_model.tokenizer.encode("ab")
    free = reference(chat_model, ids, 40)
    stop = free[6:8]
    cut = free[:free.find(stop)]
    assert cut == reference(chat_model, ids, 40, stop=[stop])
    r = client.completions.create(model="chat", prompt="ab", max_tokens=40, temperature=0,
                                  stop=[stop, "never there"])
    assert r.choices[0].text == cut and r.choices[0].finish_reason == "stop"
    streamed = client.completions.create(model="chat", prompt="ab", max_tokens=40,
                                         temperature=0, stop=stop, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == cut


def test_n_choices_draw_with_seed_plus_j(client, chat_model):
    ids = chat_model.tokenizer.encode("cab")
    r = client.completions.create(model="chat", prompt=["cab", "k"], max_tokens=15, n=3,
                                  temperature=1.0, seed=11)
    assert [c.index for c in r.choices] == list(range(6))
    texts = [c.text for c in r.choices]
    assert texts[:3] == [reference(chat_model, ids, 15, seed=11 + j, temperature=1.0)
                         for j in range(3)]
    k = chat_model.tokenizer.encode("k")
    assert texts[3:] == [reference(chat_model, k, 15, seed=11 + j, temperature=1.0)
                         for j in range(3)]
    assert len(set(texts[:3])) > 1  # (different draws)
    assert r.usage.prompt_tokens == len(ids) + len(k)
    g = client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=10, n=4,
                                       temperature=0)
    assert len({c.message.content for c in g.choices}) == 1 and len(g.choices) == 4
