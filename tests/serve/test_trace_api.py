"""`POST /v1/trace` and `POST /v1/backward` (the page's Step and Backprop views) through a real
`sheepop serve`: their numbers are sheepop.arch.trace's and sheepop.train.backward_step's on the
run's weights, the sampling and the draw are generation's own, a chat conversation and a
continuation are traced as the page sends them, and every malformed request is a 400 naming its
field while the server keeps serving."""

from __future__ import annotations

import signal

import numpy as np
import pytest
from serve_helpers import ServerProcess, call

from sheepop.arch.trace import trace_token
from sheepop.generation.sample import draw, probabilities
from sheepop.inference.load import never_generated, read_run
from sheepop.tokenizers.chat import chat_ids
from sheepop.train.backward_step import backward_step

PROMPT = "abc def gh"


@pytest.fixture(scope="module")
def plain(runs):
    s = ServerProcess(runs[1], "--engine", "numpy")
    yield s, runs[1]
    assert s.stop(signal.SIGTERM) == 0


def test_the_trace_is_the_arch_trace_and_samples_as_generation(plain):
    server, run = plain
    cfg, tok, w = read_run(run)
    body = {"prompt": PROMPT, "continuation": ["a", "b"], "position": 5, "layer": 1,
            "temperature": 0.7, "top_k": 4, "top_p": 0.8, "seed": 11}
    x = call(server.url, "POST", "/v1/trace", body).json()
    ids = tok.encode(PROMPT) + tok.encode("a") + tok.encode("b")
    assert [t["id"] for t in x["tokens"]] == ids and x["prompt_tokens"] == len(PROMPT)
    mine = trace_token(w, cfg.model, ids, 5, 1)
    for h, head in enumerate(mine.heads):
        got = x["block"]["heads"][h]
        np.testing.assert_allclose(got["weights"], head.weights, atol=1e-7)
        np.testing.assert_allclose(got["q"], head.q, atol=1e-6)
        assert got["allowed"] == head.allowed.tolist()
    np.testing.assert_allclose(x["block"]["x2"], mine.x2, atol=1e-6)
    np.testing.assert_allclose(x["stream_norms"], mine.stream_norms, rtol=1e-6)
    # the sampling: generation's rule on z_t with the never-generated ids at -inf
    z = mine.logits.astype(np.float64)
    z[never_generated(tok)] = -np.inf
    final = probabilities(z, 0.7, 4, 0.8)
    s = x["sampling"]
    assert s["draw"]["id"] == draw(final, np.random.default_rng(11))
    assert s["kept_k"] == 4 and abs(s["sum_k"] - 1) < 1e-12 and abs(s["sum_final"] - 1) < 1e-12
    assert s["kept_p"] == int((final > 0).sum()) <= 4
    assert s["actual"]["id"] == ids[6]
    rows = {r["id"]: r for r in s["rows"]}
    for i in np.flatnonzero(final):
        assert abs(rows[int(i)]["p_final"] - final[i]) < 1e-12
    full = call(server.url, "POST", "/v1/trace", {**body, "full_vocab": True}).json()["logits"]
    np.testing.assert_allclose(full["full"], mine.logits, atol=1e-4)
    assert len(full["probs"]) == cfg.model.vocab_size


def test_a_chat_conversation_is_traced_through_its_template(runs):
    server = ServerProcess(runs[0], "--engine", "numpy")
    try:
        cfg, tok, w = read_run(runs[0])
        messages = [{"role": "user", "content": "abc"}]
        x = call(server.url, "POST", "/v1/trace", {"messages": messages, "layer": 1}).json()
        ids = chat_ids(tok, messages, add_generation_prompt=True)[0]
        assert [t["id"] for t in x["tokens"]] == ids and x["position"] == len(ids) - 1
        mine = trace_token(w, cfg.model, ids, len(ids) - 1, 1)
        np.testing.assert_allclose(x["embedding"]["position"], mine.pos_term, atol=1e-7)  # s P[t]
        np.testing.assert_allclose(x["final_norm"]["y"], mine.final_norm.y, atol=1e-6)
    finally:
        assert server.stop(signal.SIGTERM) == 0


def test_the_backward_step_is_the_engines(plain):
    server, run = plain
    cfg, tok, w = read_run(run)
    x = call(server.url, "POST", "/v1/backward", {"prompt": PROMPT, "position": 2,
                                                  "top": 3}).json()
    ids = tok.encode(PROMPT)
    step = backward_step(w, cfg.model, ids)
    assert x["n"] == len(ids) - 1 and abs(x["loss"] - step.loss) < 1e-9
    assert x["target"]["id"] == ids[3] and len(x["dz"]["rows"]) == 4
    assert x["dz"]["rows"][0]["dz"] == pytest.approx(step.dz[2, ids[3]], abs=1e-12)
    each = {p["name"]: p["norm"] for layer in x["layers"] for p in layer["params"]}
    assert set(each) == set(w)  # every weight, grouped in the order of the forward pass
    assert [g["layer"] for g in x["layers"]] == ["embedding", "block 1", "block 2",
                                                 "final norm and head"]
    for name, g in step.grads.items():
        assert each[name] == pytest.approx(float(np.linalg.norm(g.astype(np.float64))),
                                           rel=1e-9)


@pytest.mark.parametrize("path,body,param", [
    ("/v1/trace", {"prompt": PROMPT, "position": 10}, "position"),
    ("/v1/trace", {"prompt": PROMPT, "position": -1}, "position"),
    ("/v1/trace", {"prompt": PROMPT, "layer": 2}, "layer"),
    ("/v1/trace", {"prompt": PROMPT, "top_k": -1}, "top_k"),
    ("/v1/trace", {"prompt": PROMPT, "temperature": "hot"}, "temperature"),
    ("/v1/trace", {"prompt": PROMPT, "top_p": 0}, "top_p"),
    ("/v1/trace", {"prompt": PROMPT, "seed": 1.5}, "seed"),
    ("/v1/trace", {"prompt": PROMPT, "continuation": "abc"}, "continuation"),
    ("/v1/trace", {"prompt": PROMPT, "full_vocab": 1}, "full_vocab"),
    ("/v1/trace", {"prompt": "a" * 65}, "prompt"),
    ("/v1/trace", {"prompt": ""}, "prompt"),
    ("/v1/trace", "[\"not\", \"an\", \"object\"]", None),
    ("/v1/backward", {"prompt": "a"}, "prompt"),
    ("/v1/backward", {"prompt": PROMPT, "position": 9}, "position"),
    ("/v1/backward", {"prompt": PROMPT, "top": 0}, "top"),
    ("/v1/backward", {"messages": [{"role": "user", "content": "x"}]}, "messages"),
])
def test_malformed_requests_are_refused_and_the_server_keeps_serving(plain, path, body, param):
    server, _ = plain
    reply = call(server.url, "POST", path, body)
    assert reply.status == 400, reply.text[:300]
    assert reply.json()["error"]["param"] == param
    assert call(server.url, "POST", "/v1/trace", {"prompt": "ab"}).status == 200


def test_a_trace_reads_at_most_max_tokens():
    """A context longer than MAX_TOKENS is bounded by it: every layer forms (H, T, T) scores."""
    from serve_helpers import weights

    from sheepop.config.schema import Config, ModelConfig
    from sheepop.inference.load import build
    from sheepop.serve.protocol import ApiError
    from sheepop.serve.trace import MAX_TOKENS, request_ids
    from sheepop.tokenizers import train_tokenizer
    tok = train_tokenizer("char", ["ab"])
    cfg = Config()
    cfg.model = ModelConfig(vocab_size=tok.vocab_size, block_size=2048, n_layer=1, n_head=1,
                            n_embd=8)
    model = build(cfg, weights(cfg.model), tok, engine="numpy")
    ids, prompt = request_ids({"prompt": [5] * MAX_TOKENS}, model)
    assert len(ids) == prompt == MAX_TOKENS
    with pytest.raises(ApiError) as e:
        request_ids({"prompt": [5] * MAX_TOKENS, "continuation": ["a"]}, model)
    assert e.value.status == 400 and "at most 1024" in str(e.value)


def test_the_softmax_rows_are_inspects_attention_rows(plain):
    """Endpoint to endpoint: /v1/trace's A_t of every head equals /v1/inspect's row t of that
    layer and head, and its p the next-token p /v1/inspect gives at t."""
    server, _ = plain
    ids = [t["id"] for t in call(server.url, "POST", "/v1/trace",
                                 {"prompt": PROMPT}).json()["tokens"]]
    seen = call(server.url, "POST", "/v1/inspect", {"prompt": ids}).json()
    for layer, t in ((0, 9), (1, 4)):
        x = call(server.url, "POST", "/v1/trace", {"prompt": ids, "position": t,
                                                   "layer": layer}).json()
        for h, head in enumerate(x["block"]["heads"]):
            np.testing.assert_allclose(head["weights"][:t + 1],
                                       seen["attention"]["weights"][layer][h][t], atol=2e-7)
        p = {r["id"]: r["p"] for r in x["sampling"]["rows"]}
        for i, q in zip(seen["next"]["ids"][t], seen["next"]["probs"][t]):
            assert abs(p[i] - q) < 1e-6
