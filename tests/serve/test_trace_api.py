"""`POST /v1/trace` and `POST /v1/backward` (the page's Step and Backprop views) through a real
`sheepop serve`: their numbers are sheepop.scratch.token_steps' and
sheepop.train.backward_step's on the run's weights, the sampling and the draw are generation's
own, a chat conversation and a continuation are traced as the page sends them, and every
malformed request is a 400 naming its field while the server keeps serving."""

from __future__ import annotations

import signal

import numpy as np
import pytest
from float_tolerance import STEPS_PER_BLOCK, float32_tolerance, model_depth
from serve_helpers import ServerProcess, call

from sheepop.generation.sample import draw, probabilities
from sheepop.inference.load import never_generated, read_run
from sheepop.scratch.gpt import gpt_forward
from sheepop.scratch.token_steps import trace_token
from sheepop.tokenizers.chat_format import chat_ids
from sheepop.train.backward_step import backward_step

PROMPT = "abc def gh"


def longest_sum(cfg) -> int:
    """The most terms any float32 sum of the model adds: its feed-forward width, its context
    or its vocabulary."""
    return max(cfg.ffn_dim, cfg.n_embd, cfg.block_size, cfg.vocab_size)


def tolerance(cfg, depth: int, values) -> float:
    """How far the server's float32 numbers may be from this process's: the same formula on the
    same weights, but the server keeps each matrix in the layout its products read fastest
    (NumpyLM's column-major) and another CPU sums in another order (AVX-512 against AVX2: 1e-6
    apart in softmax weights, issue 41). tests/helpers/float_tolerance.py derives it."""
    return float32_tolerance(longest_sum(cfg), depth, float(np.abs(values).max()))


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
    m, before = cfg.model, STEPS_PER_BLOCK * 1  # layer 1: one whole block before it
    for h, head in enumerate(mine.heads):
        got = x["block"]["heads"][h]
        # softmax moves no weight by more than twice its scores' largest change
        scores = tolerance(m, before + 3, head.raw[head.allowed])  # norm, qkv, scores
        np.testing.assert_allclose(got["weights"], head.weights, rtol=0, atol=2 * scores)
        np.testing.assert_allclose(got["q"], head.q, rtol=0, atol=tolerance(m, before + 2, head.q))
        assert got["allowed"] == head.allowed.tolist()
    np.testing.assert_allclose(x["block"]["x2"], mine.x2, rtol=0,
                               atol=tolerance(m, before + STEPS_PER_BLOCK, mine.x2))
    np.testing.assert_allclose(x["stream_norms"], mine.stream_norms,
                               rtol=tolerance(m, model_depth(m.n_layer), 1.0))
    # the sampling: generation's rule on z_t with the never-generated ids at -inf
    z = mine.logits.astype(np.float64)
    z[never_generated(tok)] = -np.inf
    final = probabilities(z, 0.7, 4, 0.8)
    # a probability moves by at most twice the largest change of the logits it is a softmax
    # of, here divided by the temperature
    dz = tolerance(cfg.model, model_depth(cfg.model.n_layer), mine.logits)
    s = x["sampling"]
    assert s["draw"]["id"] == draw(final, np.random.default_rng(11))
    assert s["kept_k"] == 4 and abs(s["sum_k"] - 1) < 1e-12 and abs(s["sum_final"] - 1) < 1e-12
    assert s["kept_p"] == int((final > 0).sum()) <= 4
    assert s["actual"]["id"] == ids[6]
    rows = {r["id"]: r for r in s["rows"]}
    for i in np.flatnonzero(final):
        assert abs(rows[int(i)]["p_final"] - final[i]) <= 2 * dz / 0.7
    full = call(server.url, "POST", "/v1/trace", {**body, "full_vocab": True}).json()["logits"]
    # sent rounded to 4 decimals
    np.testing.assert_allclose(full["full"], mine.logits, rtol=0, atol=5e-5 + dz)
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
        m = cfg.model  # s P[t]: one product; the final norm: the whole model but the head
        np.testing.assert_allclose(x["embedding"]["position"], mine.pos_term, rtol=0,
                                   atol=tolerance(m, 1, mine.pos_term))
        np.testing.assert_allclose(x["final_norm"]["y"], mine.final_norm.y, rtol=0,
                                   atol=tolerance(m, model_depth(m.n_layer) - 1,
                                                  mine.final_norm.y))
    finally:
        assert server.stop(signal.SIGTERM) == 0


def test_the_backward_step_is_the_engines(plain):
    server, run = plain
    cfg, tok, w = read_run(run)
    x = call(server.url, "POST", "/v1/backward", {"prompt": PROMPT, "position": 2,
                                                  "top": 3}).json()
    ids = tok.encode(PROMPT)
    step = backward_step(w, cfg.model, ids)
    # the loss, log sum exp z - z_y averaged, and each P - Y move by at most twice the logits'
    # largest change; the gradients run the chain back: twice its depth, relative to each norm
    m, n = cfg.model, len(ids) - 1
    logits = gpt_forward(w, m, np.asarray([ids[:-1]]))[0]
    dz = tolerance(m, model_depth(m.n_layer), logits)
    assert x["n"] == n and abs(x["loss"] - step.loss) <= 2 * dz
    assert x["engine"] == "numpy (hand-written backward pass)" and x["seconds"] > 0
    assert x["target"]["id"] == ids[3] and len(x["dz"]["rows"]) == 4
    assert x["dz"]["rows"][0]["dz"] == pytest.approx(step.dz[2, ids[3]], abs=2 * dz / n)
    each = {p["name"]: p["norm"] for layer in x["layers"] for p in layer["params"]}
    assert set(each) == set(w)  # every weight, grouped in the order of the forward pass
    assert [g["layer"] for g in x["layers"]] == ["embedding", "block 1", "block 2",
                                                 "final norm and head"]
    for name, g in step.grads.items():
        assert each[name] == pytest.approx(float(np.linalg.norm(g.astype(np.float64))),
                                           rel=tolerance(m, 2 * model_depth(m.n_layer), 1.0))


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
    ("/v1/backward", "[\"not\", \"an\", \"object\"]", None),
    ("/v1/patch", "[\"not\", \"an\", \"object\"]", None),
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
    from sheepop.serve.api.protocol import ApiError
    from sheepop.serve.page.step_view import MAX_TOKENS, request_ids
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
    server, run = plain
    m = read_run(run)[0].model
    ids = [t["id"] for t in call(server.url, "POST", "/v1/trace",
                                 {"prompt": PROMPT}).json()["tokens"]]
    seen = call(server.url, "POST", "/v1/inspect", {"prompt": ids}).json()
    for layer, t in ((0, 9), (1, 4)):
        x = call(server.url, "POST", "/v1/trace", {"prompt": ids, "position": t,
                                                   "layer": layer}).json()
        # two passes of the same model (one position; all of them through the KV cache): their
        # products have other shapes, so their sums another order (tolerance() above)
        for h, head in enumerate(x["block"]["heads"]):
            raw = np.asarray(head["raw"])[np.asarray(head["allowed"])]
            scores = tolerance(m, STEPS_PER_BLOCK * layer + 3, raw)
            np.testing.assert_allclose(head["weights"][:t + 1],
                                       seen["attention"]["weights"][layer][h][t], rtol=0,
                                       atol=2 * scores)
        z = x["logits"]
        dz = tolerance(m, model_depth(m.n_layer), [z["min"], z["max"]])
        p = {r["id"]: r["p"] for r in x["sampling"]["rows"]}
        for i, q in zip(seen["next"]["ids"][t], seen["next"]["probs"][t]):
            assert abs(p[i] - q) <= 2 * dz
