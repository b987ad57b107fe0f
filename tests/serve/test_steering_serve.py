"""The server's "steering" field (docs/steering.md, docs/serve.md): {vector name: strength} over
the vectors `serve --steer` loaded. A steered request's greedy text is `sheepop generate
--steer`'s; strength 0 is the plain text; requests steered differently in one running batch
each get their own; a steered prompt neither takes nor leaves keys in the prefix cache (the
plain request after it is the plain text); a bad field is a 400 naming it and the server keeps
serving; a vector of another width is refused at start in one line."""

from __future__ import annotations

import threading

import pytest
from cli_refusal import fails
from serve_helpers import InProcess, call, reference, weights

from sheepop.checkpoint import format as checkpoint
from sheepop.config.schema import Config, ModelConfig
from sheepop.generation.steering import Steering
from sheepop.inference.load import load
from sheepop.inference.steer import make_vector
from sheepop.tokenizers import train_tokenizer

PROMPT = "abc abc hij hij abc abc hij hij abc ab"  # 37 tokens: 2 prefix-cache blocks


@pytest.fixture(scope="module")
def served(runs):
    model = load(runs[1], engine="numpy")
    vectors = {"ab": make_vector(model, "plain", ["abab abab", "aaa bbb"], ["hij hij"], 1),
               "ij": make_vector(model, "plain", ["iii jjj"], ["abab"], 0)}
    server = InProcess(load(runs[1], engine="numpy"), vectors=vectors, max_batch=4)
    yield model, vectors, server
    server.close()


def complete(server, **body):
    reply = call(server.url, "POST", "/v1/completions",
                 {"prompt": PROMPT, "max_tokens": 20, "temperature": 0, **body})
    return reply.status, reply.json()


def steered(model, vectors, strengths) -> str:
    """`sheepop generate --steer` on the same model: the text the server must give."""
    model.lm.steer(Steering(tuple((vectors[n], s) for n, s in strengths.items())))
    try:
        return reference(model, model.tokenizer.encode(PROMPT), 20)
    finally:
        model.lm.steer(None)


def test_a_steered_request_is_generate_steered(served):
    model, vectors, server = served
    plain = reference(model, model.tokenizer.encode(PROMPT), 20)
    status, got = complete(server, steering={"ab": 0})
    assert status == 200 and got["choices"][0]["text"] == plain
    for strengths in ({"ab": 3.0}, {"ab": -2.5, "ij": 2}):
        want = steered(model, vectors, strengths)
        assert want != plain
        status, got = complete(server, steering=strengths)
        assert status == 200 and got["choices"][0]["text"] == want, strengths
        # the same prompt again, plain: no steered keys were reused from the prefix cache
        status, got = complete(server)
        assert status == 200 and got["choices"][0]["text"] == plain


def test_requests_steered_differently_share_a_batch(served):
    model, vectors, server = served
    asks = [{"ab": 3.0}, None, {"ij": 2.0}, {"ab": -2.5, "ij": 2}]
    want = [steered(model, vectors, a) if a else
            reference(model, model.tokenizer.encode(PROMPT), 20) for a in asks]
    got: list = [None] * len(asks)
    release = server.hold()  # all four admitted together: one batch

    def ask(i):
        body = {} if asks[i] is None else {"steering": asks[i]}
        got[i] = complete(server, **body)
    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(asks))]
    for t in threads:
        t.start()
    while len(server.scheduler.waiting) < len(asks):
        threading.Event().wait(0.01)
    release.set()
    for t in threads:
        t.join(120)
    assert [g[0] for g in got] == [200] * 4
    assert [g[1]["choices"][0]["text"] for g in got] == want
    assert server.scheduler.stats["peak_running"] >= 2


@pytest.mark.parametrize("value, says", [
    (5, "'steering' must be an object {vector name: strength}"),
    ({"nope": 1}, "'steering' names no vector 'nope' (this server's: ab, ij)"),
    ({"ab": "2"}, "'steering.ab' must be a number from -1000 to 1000"),
    ({"ab": 1e9}, "'steering.ab' must be a number from -1000 to 1000"),
    ({"ab": True}, "'steering.ab' must be a number from -1000 to 1000"),
])
def test_a_bad_steering_is_a_400_and_the_server_keeps_serving(served, value, says):
    model, _, server = served
    status, got = complete(server, steering=value)
    assert status == 400 and got["error"]["param"] == "steering"
    assert says in got["error"]["message"]
    status, got = complete(server)
    assert status == 200
    assert got["choices"][0]["text"] == reference(model, model.tokenizer.encode(PROMPT), 20)


def test_a_vector_of_another_width_is_refused_at_start(tmp_path, served, capsys):
    _, vectors, _ = served
    path = tmp_path / "v.safetensors"
    vectors["ab"].save(path)
    tok = train_tokenizer("char", ["abcdefgh ijk.\n"])
    cfg = Config()
    cfg.model = ModelConfig(vocab_size=tok.vocab_size, block_size=64, n_layer=2, n_head=2,
                            n_embd=16)
    narrow = tmp_path / "narrow"
    checkpoint.save_checkpoint(narrow, weights(cfg.model), cfg.to_dict(), tok.to_json())
    fails(capsys, ["serve", str(narrow), "--port", "0", "--engine", "numpy", "--steer",
                   str(path)], f"{path}: a steering vector of width 32 (made on model "
                               "'plain') cannot steer model 'narrow' of width 16")
