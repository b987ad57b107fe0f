"""`sheepop serve` on a model whose chat template never ends (issue 41, section 5): the request
gets a 400 naming the bound, and while its template renders the server answers others (/health):
the rendering runs off the event loop, and its bound stops it."""

from __future__ import annotations

import threading

import pytest
from chatml import chatml_tokenizer
from serve_helpers import BOUND_S, InProcess, call, weights

from sheepop.checkpoint import format as checkpoint
from sheepop.config.schema import Config, ModelConfig
from sheepop.inference.load import load
from sheepop.serve.page.routes import routes as page_routes
from sheepop.tokenizers import chat_template

NEVER_ENDS = ("{% for i in range(100000) %}{% for j in range(100000) %}xxxxxxxxxx{% endfor %}"
              "{% endfor %}")
MESSAGES = [{"role": "user", "content": "hi"}]
REQUESTS = {"/v1/chat/completions": {"messages": MESSAGES, "max_tokens": 2},
            "/v1/inspect": {"messages": MESSAGES},
            "/v1/trace": {"messages": MESSAGES},
            "/v1/backward": {"messages": MESSAGES}}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tok = chatml_tokenizer(NEVER_ENDS)
    cfg = Config()
    cfg.model = ModelConfig(vocab_size=tok.vocab_size, block_size=32, n_layer=1, n_head=2,
                            n_embd=16)
    run = tmp_path_factory.mktemp("never-ends") / "run"
    checkpoint.save_checkpoint(run, weights(cfg.model), cfg.to_dict(), tok.to_json())
    srv = InProcess(load(run, "numpy"), routes=page_routes(run, None))
    yield srv
    srv.close()


@pytest.mark.parametrize("path", list(REQUESTS))
def test_health_answers_while_a_template_renders_and_the_request_gets_400(server, path,
                                                                         monkeypatch):
    # The rendering is held as it starts until /health has answered: were it on the event loop,
    # /health could not answer (the call would time out after BOUND_S, the hold lasts longer).
    held, release = threading.Event(), threading.Event()
    budget_for = chat_template.budget_for

    def held_budget(variables):
        held.set()
        release.wait(3 * BOUND_S)
        return budget_for(variables)  # (its clock starts here)

    monkeypatch.setattr(chat_template, "budget_for", held_budget)
    replies = []
    request = threading.Thread(target=lambda: replies.append(
        call(server.url, "POST", path, REQUESTS[path])))
    request.start()
    try:
        assert held.wait(BOUND_S), "the template never rendered"
        health = call(server.url, "GET", "/health")
        assert health.status == 200 and health.json()["status"] == "ok"
    finally:
        release.set()
        request.join(BOUND_S)
    reply = replies[0]
    assert reply.status == 400, reply.text[:300]
    message = reply.json()["error"]["message"]
    assert message.startswith("the chat template was stopped: its output passed "), message
