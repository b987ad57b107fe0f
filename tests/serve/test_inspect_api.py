"""POST /v1/inspect, GET /v1/runs and the page's files, against live `sheepop serve` processes:
the numbers the page draws are the engine's own (1e-6), in both engines; bad requests get a 4xx
JSON error and the server keeps serving."""

import base64
import json
import math
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch
from serve_helpers import KEY, ServerProcess, call

from sheepop.generation.sample import probabilities
from sheepop.model.hooks import hooked
from sheepop.scratch import gpt_forward
from sheepop.tokenizers.chat_format import chat_ids

TESTIDS = ["prompt", "generate", "view-generate", "view-inside", "view-runs", "layer", "head",
           "attention", "logit-lens", "loss-chart", "alternatives"]


def engine_attention(model, ids: list[int], layers: list[int]) -> dict[int, np.ndarray]:
    """The attention weights (H, T, T) of `layers`, straight from the engine's forward pass."""
    if model.engine == "torch":
        weights = {}
        keep = lambda a, point: weights.__setitem__(int(point.split(".")[1]), a)  # noqa: E731
        with torch.no_grad(), hooked(model.lm.model,
                                     {f"blocks.{i}.attn.pattern": keep for i in layers}):
            model.lm.model(torch.tensor([ids]))
        return {layer: w[0].float().numpy() for layer, w in weights.items()}
    _, _, cache = gpt_forward(model.lm.params, model.config.model, np.array([ids]))
    return {layer: cache.blocks[layer].attn.core.a[0] for layer in layers}


def assert_same_attention(answer: dict, model, ids: list[int]) -> None:
    layers = answer["attention"]["layers"]
    own = engine_attention(model, ids, layers)
    assert len(answer["attention"]["weights"]) == len(layers)
    for layer, heads in zip(layers, answer["attention"]["weights"]):
        for h, rows in enumerate(heads):
            assert [len(r) for r in rows] == list(range(1, len(ids) + 1))  # the triangle
            full = np.zeros((len(ids), len(ids)))
            for t, row in enumerate(rows):
                full[t, :t + 1] = row
            np.testing.assert_allclose(full, own[layer][h], rtol=0, atol=1e-6)


def test_the_attention_of_the_numpy_engine(plain_server, plain_model):
    prompt = "abc defg hij"
    r = call(plain_server.url, "POST", "/v1/inspect", {"prompt": prompt, "top": 3})
    assert r.status == 200, r.text
    answer = r.json()
    ids = plain_model.tokenizer.encode(prompt)
    assert [t["id"] for t in answer["tokens"]] == ids
    assert "".join(t["text"] for t in answer["tokens"]) == prompt
    assert_same_attention(answer, plain_model, ids)
    assert answer["positions"]["kind"] == "rope"
    m = plain_model.config.model
    assert len(answer["lens"]["ids"]) == m.n_layer + 1
    assert answer["lens"]["layers"] == ["embedding", "block 1", "block 2"]
    assert np.shape(answer["lens"]["probs"]) == (m.n_layer + 1, len(ids), 3)
    assert answer["lens"]["ids"][-1] == answer["next"]["ids"]  # the last layer is the model
    assert answer["next"]["next_prob"][-1] is None
    # The probability of the prompt's own next token, from the model's logits, the
    # never-generated ids excluded (the sampler's rule).
    logits = plain_model.lm.prompt_logits(ids).astype(np.float64)
    logits[:, answer["never_generate"]] = -np.inf
    assert sorted(answer["never_generate"]) == sorted(plain_model.lm.never_generate)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    np.testing.assert_allclose(answer["next"]["next_prob"][:-1],
                               p[np.arange(len(ids) - 1), ids[1:]], atol=1e-5)


def logits_row(answer: dict) -> np.ndarray:
    """The final logits of `logits_at` (V,), decoded from little-endian float32 in base64."""
    raw = base64.b64decode(answer["logits"]["float32"])
    return np.frombuffer(raw, dtype="<f4").astype(np.float64)


def test_one_p_everywhere_and_the_distribution_each_token_was_drawn_from(plain_server,
                                                                         plain_model):
    """A token's p in /v1/inspect is the completion's logprob exp'ed (5e-6), the model's
    distribution with the never-generated ids excluded; each generated token's `sampled` is
    q = probabilities(z, T, k, p) of the logits /v1/inspect gives at its position: after
    top-k 3 it is 3 tokens that sum to 1, and the token drawn is one of them."""
    prompt, T, k = "abc de", 0.8, 3
    r = call(plain_server.url, "POST", "/v1/completions", {
        "prompt": prompt, "max_tokens": 6, "temperature": T, "top_k": k, "top_p": 1,
        "min_p": 0, "logprobs": 5, "seed": 3})  # (top-k alone: the server's defaults cut more)
    assert r.status == 200, r.text
    lp = r.json()["choices"][0]["logprobs"]
    generated = [s["id"] for s in lp["sampled"]]
    assert "".join(lp["tokens"]) == plain_model.tokenizer.decode(generated)
    ids = plain_model.tokenizer.encode(prompt)
    answer = call(plain_server.url, "POST", "/v1/inspect", {
        "prompt": prompt, "generated": generated[:-1], "lens": False}).json()
    assert [t["id"] for t in answer["tokens"]] == ids + generated[:-1]
    n = len(ids)
    shown = np.exp(lp["token_logprobs"][:-1])
    # The completion's p comes from one-row products through the KV cache, /v1/inspect's from
    # the prompt's matrix product: float32 sums in another order, logits apart by up to ~1e-5
    # (7.6e-6 measured on this model, in either weight layout), p by p (1 - p) of that.
    np.testing.assert_allclose(answer["next"]["next_prob"][n - 1:-1], shown, rtol=0, atol=5e-6)
    for j, top in enumerate(lp["top_logprobs"]):  # the alternatives: the same five, same p
        assert list(top) == answer["next"]["texts"][n - 1 + j]
        np.testing.assert_allclose(np.exp(list(top.values())),
                                   answer["next"]["probs"][n - 1 + j], rtol=0, atol=5e-6)
    for j, (token, drawn) in enumerate(zip(generated, lp["sampled"])):
        at = call(plain_server.url, "POST", "/v1/inspect", {
            "prompt": prompt, "generated": generated[:j], "layers": [], "lens": False,
            "logits_at": n - 1 + j}).json()
        z = logits_row(at)
        assert np.isneginf(z[answer["never_generate"]]).all()
        q = probabilities(z, T, k, 1.0)
        assert np.count_nonzero(q) == k and math.isclose(q.sum(), 1, abs_tol=1e-12)
        top = drawn["top_logprobs"]
        assert len(top) == k and token in [t["id"] for t in top]
        # (generation's logits came through the KV cache, and these from a shorter forward pass:
        # float32 sums in another order, ~2e-6 apart in p and q)
        np.testing.assert_allclose(np.exp([t["logprob"] for t in top]),
                                   q[[t["id"] for t in top]], rtol=0, atol=1e-5)
        np.testing.assert_allclose(math.exp(drawn["logprob"]), q[token], rtol=0, atol=1e-5)
        p = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
        np.testing.assert_allclose(np.exp([t["model_logprob"] for t in top]),
                                   p[[t["id"] for t in top]], rtol=0, atol=1e-5)


def test_the_attention_of_the_torch_engine_for_a_conversation(server, chat_model):
    messages = [{"role": "user", "content": "abc def"}]
    r = call(server.url, "POST", "/v1/inspect", {"messages": messages, "layers": [1],
                                                 "lens": False}, key=KEY)
    assert r.status == 200, r.text
    answer = r.json()
    ids = chat_ids(chat_model.tokenizer, messages, add_generation_prompt=True)[0]
    assert [t["id"] for t in answer["tokens"]] == ids
    assert answer["attention"]["layers"] == [1]
    assert "lens" not in answer
    assert_same_attention(answer, chat_model, ids)
    assert answer["positions"]["kind"] == "sinusoidal"
    assert np.shape(answer["positions"]["values"]) == (len(ids), 32)
    assert answer["positions"]["scale"] == chat_model.config.model.sinusoid_scale == 32 ** -0.5
    # The tokens a generation drew come after the opened assistant turn, as they are.
    more = call(server.url, "POST", "/v1/inspect", {"messages": messages, "generated": [5, 6],
                                                    "layers": [], "lens": False}, key=KEY)
    assert [t["id"] for t in more.json()["tokens"]] == ids + [5, 6]


def test_the_models_shape(server, plain_server):
    shape = call(server.url, "GET", "/v1/inspect", key=KEY).json()
    assert (shape["n_layer"], shape["n_head"], shape["context"], shape["chat"],
            shape["engine"]) == (2, 2, 64, True, "torch")
    shape = call(plain_server.url, "GET", "/v1/inspect").json()
    assert (shape["pos_encoding"], shape["chat"], shape["engine"]) == ("rope", False, "numpy")
    assert shape["tied"] is False  # (these runs keep a head of their own)


@pytest.mark.parametrize("body, status, param, code", [
    ({"prompt": "a" * 65}, 400, "prompt", "context_length_exceeded"),
    ({"prompt": list(range(3)) * 30}, 400, "prompt", "context_length_exceeded"),
    ({"prompt": ""}, 400, "prompt", None),
    ({"prompt": [10_000]}, 400, "prompt", None),
    ({"prompt": "abc", "top": 0}, 400, "top", None),
    ({"prompt": "abc", "top": 21}, 400, "top", None),
    ({"prompt": "abc", "layers": [2]}, 400, "layers", None),
    ({"prompt": "abc", "layers": "all"}, 400, "layers", None),
    ({"prompt": "abc", "lens": "no"}, 400, "lens", None),
    ({"messages": [{"role": "user", "content": "a"}]}, 400, "messages", "no_chat_template"),
    ({"prompt": "abc", "model": "other"}, 404, "model", "model_not_found"),
    ({"prompt": "abc", "generated": [1, "b"]}, 400, "generated", None),
    ({"prompt": "abc", "generated": [10_000]}, 400, "generated", None),
    ({"prompt": "abc", "generated": [1] * 62}, 400, "prompt", "context_length_exceeded"),
    ({"prompt": "abc", "logits_at": 3}, 400, "logits_at", None),
    ({"prompt": "abc", "logits_at": True}, 400, "logits_at", None),
    ([1, 2], 400, None, None),
])
def test_bad_requests_are_refused_and_the_server_keeps_serving(plain_server, body, status,
                                                               param, code):
    r = call(plain_server.url, "POST", "/v1/inspect", body if isinstance(body, dict)
             else json.dumps(body))
    assert r.status == status, r.text
    error = r.json()["error"]
    assert (error["param"], error["code"]) == (param, code)
    assert error["message"]
    assert call(plain_server.url, "POST", "/v1/inspect", {"prompt": "a" * 64}).status == 200


def test_the_whole_context_is_inspected_and_the_key_is_required(server):
    assert call(server.url, "POST", "/v1/inspect", {"prompt": "abc"}).status == 401
    r = call(server.url, "POST", "/v1/inspect", {"prompt": "abcdefgh" * 8}, key=KEY)
    assert r.status == 200
    rows = r.json()["attention"]["weights"][0][0]
    assert len(rows) == 64 and math.isclose(sum(rows[-1]), 1.0, abs_tol=1e-5)


# ----- runs and the page's files ---------------------------------------------------------------

@pytest.fixture(scope="module")
def runs_server(runs, tmp_path_factory):
    """The plain run served with --runs over a folder of two runs (one nested, one with a torn
    last line) and a folder that is no run."""
    root = tmp_path_factory.mktemp("runs")
    for name, rows in (("a", 3), ("group/b", 2)):
        (root / name).mkdir(parents=True)
        lines = [json.dumps({"step": s, "loss": 2.0 - s / 10, "lr": 1e-3}) for s in range(rows)]
        (root / name / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    with open(root / "group/b/metrics.jsonl", "a") as f:
        f.write('{"step": 2, "lo')  # a line being written
    (root / "notes").mkdir()
    s = ServerProcess(runs[1], "--engine", "numpy", "--runs", str(root))
    yield s, root
    assert s.stop(signal.SIGTERM) == 0


def test_runs_are_listed_and_their_metrics_read_incrementally(runs_server):
    s, root = runs_server
    listed = call(s.url, "GET", "/v1/runs").json()["data"]
    assert [(r["name"], r["served"], r["metrics"]) for r in listed] == [
        ("plain", True, False), ("a", False, True), ("group/b", False, True)]
    whole = call(s.url, "GET", "/v1/runs/a/metrics").json()
    assert (whole["total"], whole["reset"], [r["step"] for r in whole["rows"]]) == (3, False,
                                                                                    [0, 1, 2])
    assert whole["rows"][1] == {"step": 1, "loss": 1.9, "lr": 1e-3}
    assert call(s.url, "GET", "/v1/runs/group/b/metrics").json()["total"] == 2  # torn: skipped
    with open(root / "a/metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 3, "val_loss": 1.5, "val_bpb": 2.1}) + "\n")
    more = call(s.url, "GET", "/v1/runs/a/metrics?since=3").json()
    assert (more["total"], more["since"], more["rows"]) == (4, 3, [
        {"step": 3, "val_loss": 1.5, "val_bpb": 2.1}])
    again = call(s.url, "GET", "/v1/runs/a/metrics?since=9").json()  # rewritten shorter
    assert (again["reset"], len(again["rows"])) == (True, 4)
    assert call(s.url, "GET", "/v1/runs/plain/metrics").json()["rows"] == []


@pytest.mark.parametrize("path, status", [
    ("/v1/runs/notes/metrics", 404), ("/v1/runs/../a/metrics", 404),
    ("/v1/runs/%2e%2e%2fa/metrics", 404), ("/v1/runs/a/metrics?since=-1", 400),
    ("/docs/math/..%2f..%2fREADME.md", 404), ("/docs/math/nothing.md", 404),
    ("/static/../inspect.py", 404),
])
def test_nothing_outside_the_runs_and_the_page_is_read(runs_server, path, status):
    r = call(runs_server[0].url, "GET", path)
    assert r.status == status, r.text
    assert "error" in r.json()


def test_the_page_and_its_files_are_served(runs_server):
    url = runs_server[0].url
    page = call(url, "GET", "/")
    assert page.status == 200 and page.headers["content-type"].startswith("text/html")
    for testid in TESTIDS:
        assert f'data-testid="{testid}"' in page.text
    assert "http" not in page.text.replace("http-equiv", "")  # nothing from elsewhere
    for name in ("page.js", "common.js", "generate.js", "inside.js", "runs.js", "chart.js",
                 "tables.js", "page.css"):
        r = call(url, "GET", f"/static/{name}")
        assert r.status == 200 and "https://" not in r.text, name
    math = call(url, "GET", "/docs/math/04-attention.md")
    assert math.status == 200 and "attention" in math.text.lower()


def test_a_runs_folder_that_is_not_there_is_refused_in_one_line(runs, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "sheepop", "serve", str(runs[1]), "--port", "0",
                           "--runs", str(tmp_path / "nowhere")], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"sheepop: error: --runs {tmp_path / 'nowhere'}: not a directory"]
