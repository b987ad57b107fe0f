"""A hostile web page or client against `sheepop serve` (issue 28): requests for another Host
(DNS rebinding) or from another site's page are refused before anything runs; bodies nested
100,000 deep, a 5,000-digit `since`, a 400-digit temperature and a model whose weights overflow
get a 4xx in OpenAI's error shape, never a 500 nor a bare NaN; `--runs` reads only what a
metrics.jsonl gained, at most MAX_SCAN bytes a poll, and never a file through a link."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from serve_helpers import CONTEXT, InProcess, call, weights

from sheepop.checkpoint import format as checkpoint
from sheepop.cli import main
from sheepop.config.schema import Config, ModelConfig
from sheepop.inference.load import load
from sheepop.serve.page import runs_view as runs_module
from sheepop.serve.page.routes import routes as page_routes
from sheepop.tokenizers import train_tokenizer

OTHER_SITE = "http://localhost:3000"
GOOD = {"prompt": "abc", "max_tokens": 3, "temperature": 0}


def served(model, run, runs_dir=None, **settings) -> InProcess:
    """The app with the page's routes (its `--runs` folder `runs_dir`) in this process."""
    return InProcess(model, routes=page_routes(run, runs_dir), **settings)


def _no_constant(name: str):
    raise AssertionError(f"{name} is not JSON")


def strict(text: str):
    """`text` as JSON, refusing the NaN and Infinity Python's json reads and writes."""
    return json.loads(text, parse_constant=_no_constant)


def _error(reply, status: int, code=None, param=None) -> dict:
    """The reply is OpenAI's error shape with this status (and valid JSON)."""
    assert reply.status == status, reply.text[:300]
    assert reply.headers["content-type"] == "application/json"
    body = strict(reply.text)
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == code and body["error"]["param"] == param
    return body["error"]


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("runs-dir")


@pytest.fixture(scope="module")
def site(runs, chat_model, runs_dir):
    s = served(chat_model, runs[0], runs_dir, allow_origins=(OTHER_SITE,))
    yield s
    s.close()


# ----- who may call ------------------------------------------------------------------------------

def test_a_request_for_another_host_is_refused_before_anything_runs(site):
    """DNS rebinding: a page at evil.example whose name now resolves to 127.0.0.1 sends its
    requests with `Host: evil.example:PORT`."""
    for host in (f"evil.example:{site.port}", "evil.example", "10.1.2.3", "[fe80::1]:80"):
        e = _error(call(site.url, "POST", "/v1/completions", GOOD, headers={"Host": host}),
                   403, "host_not_allowed")
        assert host.split(":")[0].strip("[") in e["message"]
        _error(call(site.url, "GET", "/v1/runs", headers={"Host": host}), 403,
               "host_not_allowed")
    for host in (f"127.0.0.1:{site.port}", f"localhost:{site.port}", "LOCALHOST", "[::1]:80",
                 f"{OTHER_SITE[len('http://'):]}"):
        assert call(site.url, "GET", "/v1/models", headers={"Host": host}).status == 200


def test_another_sites_page_is_refused_even_with_a_simple_text_plain_post(site):
    """A `text/plain` POST needs no preflight: the browser sends it, the server must not run it."""
    before = site.server.config.app.state.scheduler.status()["tokens"]
    for origin in ("http://evil.example", "null", f"http://localhost:{site.port + 1}",
                   f"https://evil.example:{site.port}"):
        for path, body in (("/v1/completions", json.dumps(GOOD)), ("/v1/inspect",
                                                                   '{"prompt": "abc"}')):
            _error(call(site.url, "POST", path, body, headers={
                "Origin": origin, "Content-Type": "text/plain"}), 403, "origin_not_allowed")
        _error(call(site.url, "GET", "/v1/runs", headers={"Origin": origin}), 403,
               "origin_not_allowed")
    assert site.server.config.app.state.scheduler.status()["tokens"] == before


def test_the_servers_own_page_and_an_allowed_origin_may_call(site):
    own = f"http://127.0.0.1:{site.port}"
    ok = call(site.url, "POST", "/v1/completions", GOOD, headers={"Origin": own})
    assert ok.status == 200 and "access-control-allow-origin" not in ok.headers
    assert call(site.url, "POST", "/v1/completions", GOOD).status == 200  # no Origin: curl
    # the allowed origin: its preflight answered, its responses name it
    pre = call(site.url, "OPTIONS", "/v1/completions", headers={
        "Origin": OTHER_SITE, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert pre.status == 204 and pre.headers["access-control-allow-origin"] == OTHER_SITE
    assert "authorization" in pre.headers["access-control-allow-headers"]
    ok = call(site.url, "POST", "/v1/completions", GOOD, headers={"Origin": OTHER_SITE})
    assert ok.status == 200 and ok.headers["access-control-allow-origin"] == OTHER_SITE
    assert ok.json()["choices"][0]["finish_reason"] in ("length", "stop")


def test_a_host_bound_to_every_interface_takes_any_address_but_no_name(chat_model, runs):
    s = served(chat_model, runs[0], host="0.0.0.0")
    try:
        assert call(s.url, "GET", "/v1/models", headers={"Host": "192.168.1.20:8000"}).status \
            == 200
        _error(call(s.url, "GET", "/v1/models", headers={"Host": "rebind.example:8000"}), 403,
               "host_not_allowed")
    finally:
        s.close()


@pytest.mark.parametrize("args, message", [
    (["--api-key", ""], "--api-key is empty"),
    (["--allow-origin", "localhost:3000"], "--allow-origin 'localhost:3000'"),
    (["--allow-origin", "http://localhost:3000/page"], "an origin is http://"),
    (["--allow-origin", "*"], "an origin is http://"),
])
def test_an_empty_key_or_a_malformed_origin_is_one_line_and_status_2(runs, capsys, args,
                                                                     message):
    assert main(["serve", str(runs[0]), "--port", "0", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_an_empty_key_in_the_environment_is_an_error_too(runs, capsys, monkeypatch):
    monkeypatch.setenv("SHEEPOP_API_KEY", "")
    assert main(["serve", str(runs[0]), "--port", "0"]) == 2
    assert "SHEEPOP_API_KEY is empty" in capsys.readouterr().err


# ----- bodies that used to be 500s ---------------------------------------------------------------

DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", DEEP),
    ("/v1/completions", '{"prompt": ' + DEEP + "}"),
    ("/v1/chat/completions", '{"messages": ' + DEEP + "}"),
    ("/v1/inspect", '{"prompt": ' + DEEP + "}"),
    ("/v1/completions", '{"prompt": ' + "[" * 40 + "1" + "]" * 40 + "}"),  # parses: too deep
    ("/v1/inspect", '{"messages": [{"role": "user", "content": ' + "[" * 500 + "]" * 500
     + "}]}"),
])
def test_deeply_nested_bodies_are_400(site, path, body):
    e = _error(call(site.url, "POST", path, body), 400)
    assert "nests" in e["message"] and "32 levels" in e["message"]
    assert call(site.url, "POST", "/v1/completions", GOOD).status == 200


@pytest.mark.parametrize("field", ["temperature", "top_p", "repetition_penalty"])
def test_a_400_digit_number_is_400_not_an_overflow(site, field):
    body = '{"prompt": "abc", "' + field + '": 1' + '0' * 400 + '}'
    _error(call(site.url, "POST", "/v1/completions", body), 400, param=field)


def test_since_of_5000_digits_or_unicode_digits_is_400(site, runs):
    for since in ("9" * 5000, "%C2%B2", "-1", "1e3", ""):
        _error(call(site.url, "GET", f"/v1/runs/{runs[0].name}/metrics?since={since}"), 400,
               param="since")


@pytest.fixture(scope="module")
def huge_run(tmp_path_factory):
    """A tiny run whose weights are 3e38: finite on disk, infinite one matmul later."""
    tok = train_tokenizer("char", ["abcdefgh ijk.\n"])
    cfg = Config()
    cfg.model = ModelConfig(vocab_size=tok.vocab_size, block_size=CONTEXT, n_layer=2, n_head=2,
                            n_embd=32, tie_weights=False, pos_encoding="rope")
    run = tmp_path_factory.mktemp("huge") / "huge"
    checkpoint.save_checkpoint(run, {k: np.full_like(v, 3e38) for k, v in
                                     weights(cfg.model).items()}, cfg.to_dict(), tok.to_json())
    return run


@pytest.mark.parametrize("engine", ["torch", "numpy"])
@pytest.mark.filterwarnings("error::RuntimeWarning")  # the 422 alone, no NumPy warning before it
def test_a_model_whose_weights_overflow_gets_422_and_never_a_bare_nan(huge_run, engine):
    s = served(load(huge_run, engine), huge_run)
    try:
        for body in (GOOD, {**GOOD, "logprobs": 3}, {**GOOD, "n": 2},
                     {**GOOD, "echo": True, "logprobs": 2}):
            _error(call(s.url, "POST", "/v1/completions", body), 422, "non_finite_logits")
        stream = call(s.url, "POST", "/v1/completions", {**GOOD, "stream": True})
        assert stream.status == 200 and stream.text.endswith("data: [DONE]\n\n")
        events = [strict(e[len("data: "):]) for e in stream.text.split("\n\n")[:-2]]
        assert events[-1]["error"]["code"] == "non_finite_logits"
        e = _error(call(s.url, "POST", "/v1/inspect", {"prompt": "abc"}), 422,
                   "non_finite_logits")
        assert "overflow" in e["message"]
    finally:
        s.close()


# ----- --runs DIR --------------------------------------------------------------------------------

def _row(step: int, loss: float = 2.5) -> str:
    return json.dumps({"step": step, "loss": loss, "lr": 1e-3}) + "\n"


def _metrics(site, name: str, since: int = 0) -> dict:
    reply = call(site.url, "GET", f"/v1/runs/{name}/metrics?since={since}")
    assert reply.status == 200, reply.text[:300]
    return strict(reply.text)


def test_a_poll_reads_only_what_was_appended_and_at_most_max_scan(site, runs_dir,
                                                                  monkeypatch):
    monkeypatch.setattr(runs_module, "MAX_SCAN", 64 << 10)
    monkeypatch.setattr(runs_module, "MAX_ANSWER", 1 << 20)
    read: list[int] = []
    pread = os.pread
    monkeypatch.setattr(runs_module.os, "pread",
                        lambda fd, n, at: read.append(n) or pread(fd, n, at))
    run = runs_dir / "big"
    run.mkdir()
    lines = [_row(i) for i in range(8000)]  # ~400 KB: seven scans of 64 KiB
    (run / "metrics.jsonl").write_text("".join(lines))
    got, rows = None, []
    for _ in range(20):
        read.clear()
        got = _metrics(site, "big", len(rows))
        assert sum(read) <= (64 << 10) + (1 << 20) + 200  # a scan, an answer, a row checked
        rows += got["rows"]
        if not got["more"]:
            break
    assert [r["step"] for r in rows] == list(range(8000)) and got["total"] == 8000
    # a poll after 3 rows were appended reads them, not the file again
    with open(run / "metrics.jsonl", "a") as f:
        f.write(_row(8000) + _row(8001) + _row(8002))
    read.clear()
    got = _metrics(site, "big", 8000)
    assert [r["step"] for r in got["rows"]] == [8000, 8001, 8002] and not got["more"]
    assert sum(read) < 1000, read


def test_a_rewritten_shorter_file_resets_and_a_nan_loss_is_null(site, runs_dir):
    run = runs_dir / "resumed"
    run.mkdir()
    path = run / "metrics.jsonl"
    path.write_text("".join(_row(i) for i in range(10)) + '{"step": 10, "lo')  # torn
    assert _metrics(site, "resumed")["total"] == 10
    path.write_text(_row(0) + _row(1) + _row(2, float("nan")) + "x" * 70_000 + "\n")
    got = _metrics(site, "resumed", 10)
    assert got["reset"] and got["total"] == 3 and got["rows"][2]["loss"] is None


def test_a_linked_metrics_file_is_neither_listed_nor_served(site, runs_dir, tmp_path):
    outside = tmp_path / "secret.jsonl"
    outside.write_text(_row(1))
    (runs_dir / "linked").mkdir()
    (runs_dir / "linked" / "metrics.jsonl").symlink_to(outside)
    (runs_dir / "fifo").mkdir()
    os.mkfifo(runs_dir / "fifo" / "metrics.jsonl")
    names = [r["name"] for r in call(site.url, "GET", "/v1/runs").json()["data"]]
    assert "linked" not in names and "fifo" not in names
    _error(call(site.url, "GET", "/v1/runs/linked/metrics"), 404, "run_not_found", "name")
