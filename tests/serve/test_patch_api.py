"""`POST /v1/patch` through a real `sheepop serve`, in both engines: its grids are
sheepop.inference.patching's and .attribution's on the run's weights (the last block at the
last position scoring 1, the clean run), its direct logit attribution of m on each prompt is
sheepop.inference.logit_attribution's, and every malformed request is a 400 naming its field
while the server keeps serving."""

from __future__ import annotations

import numpy as np
import pytest
from float_tolerance import float32_tolerance, model_depth
from serve_helpers import KEY, InProcess, call

from sheepop.inference.attribution import attribution_grid
from sheepop.inference.hooked_engines import hooked_engine
from sheepop.inference.logit_attribution import logit_shares
from sheepop.inference.patching import contrast, patch_grid

CLEAN, CORRUPTED = "abc def", "abd deg"
BODY = {"clean": CLEAN, "corrupted": CORRUPTED, "answer": "h", "wrong": "a"}


def tolerance(cfg, grid) -> float:
    """The server's float32 pass against this process's (another thread count may sum in
    another order): twice one logit's bound in m, over m_clean - m_corrupted, for the score's
    numerator and denominator, plus the answer's rounding to 7 decimals."""
    logit = float32_tolerance(max(cfg.ffn_dim, cfg.vocab_size), model_depth(cfg.n_layer),
                              max(abs(grid.clean), abs(grid.corrupted), np.abs(grid.metric).max()))
    return 4 * logit * (1 + np.abs(grid.scores).max()) / abs(grid.clean - grid.corrupted) + 1e-7


@pytest.mark.parametrize("which", ["numpy", "torch"])
@pytest.mark.parametrize("kind", ["positions", "heads"])
def test_the_grids_are_the_modules_on_the_runs_weights(which, kind, server, plain_server,
                                                       chat_model, plain_model):
    s, model, key = ((plain_server, plain_model, None) if which == "numpy"
                     else (server, chat_model, KEY))
    reply = call(s.url, "POST", "/v1/patch", {**BODY, "kind": kind}, key=key)
    assert reply.status == 200, reply.text
    got = reply.json()
    tok = model.tokenizer
    c = contrast(tok.encode(CLEAN), tok.encode(CORRUPTED), tok.encode("h")[0],
                 tok.encode("a")[0], model.config.model.vocab_size)
    engine = hooked_engine(model)
    cfg = model.config.model
    for grid, answer in ((patch_grid(engine, c, kind), got),
                         (attribution_grid(engine, c, kind), got["attribution"])):
        scores = np.array(answer["scores"])
        assert scores.shape == grid.scores.shape == (
            cfg.n_layer, len(c.clean) if kind == "positions" else cfg.n_head)
        assert np.abs(scores - grid.scores).max() <= tolerance(cfg, grid)
    assert [t["id"] for t in got["clean"]] == c.clean and got["kind"] == kind
    assert got["answer"] == {"id": c.answer, "text": "h"}
    assert abs(got["clean_metric"] - grid.clean) <= tolerance(cfg, grid)
    if kind == "positions":
        assert got["scores"][-1][-1] == 1.0  # the clean run itself
    assert np.abs(np.array(got["scores"])).max() > 0.01


@pytest.mark.parametrize("which", ["numpy", "torch"])
def test_the_direct_logit_attribution_is_the_modules_and_sums_to_m(which, server, plain_server,
                                                                   chat_model, plain_model):
    """'logit_attribution': each part's share of m on each prompt is the answer's
    logit_shares minus the wrong token's on the run's weights, the server's float32 pass
    against this process's (one logit's bound each, twice), and the shares of the clean
    prompt sum to m_clean within the pass's own bound plus the rounding to 7 decimals."""
    s, model, key = ((plain_server, plain_model, None) if which == "numpy"
                     else (server, chat_model, KEY))
    reply = call(s.url, "POST", "/v1/patch", {**BODY, "layers": [1], "attribution": False,
                                              "logit_attribution": True}, key=key)
    assert reply.status == 200, reply.text
    got = reply.json()
    assert "attribution" not in got
    tok, cfg, engine = model.tokenizer, model.config.model, hooked_engine(model)
    answer, wrong = tok.encode("h")[0], tok.encode("a")[0]
    for prompt, text in (("clean", CLEAN), ("corrupted", CORRUPTED)):
        up, down = (logit_shares(engine, tok.encode(text), t) for t in (answer, wrong))
        expected = up.shares - down.shares
        shares = np.array(got["logit_attribution"][prompt]["shares"])
        assert got["logit_attribution"]["names"] == up.names
        assert len(up.names) == 1 + cfg.n_layer * (cfg.n_head + 1 + cfg.bias) + (
            cfg.norm == "layernorm") + cfg.head_bias  # embed, heads, b_proj, ffn; beta, b_head
        magnitude = np.abs(up.shares).sum() + np.abs(down.shares).sum()
        bound = float32_tolerance(max(cfg.ffn_dim, cfg.vocab_size),
                                  model_depth(cfg.n_layer), magnitude)
        assert np.abs(shares - expected).max() <= 2 * bound + 1e-7
        metric = got[f"{prompt}_metric"]
        assert abs(shares.sum() - metric) <= 2 * bound + 1e-7 * len(shares)
        assert np.abs(shares).max() > 0.01


@pytest.mark.parametrize("change, field", [
    ({"corrupted": "abd de"}, "corrupted"),           # 6 tokens against 7
    ({"clean": ""}, "clean"),
    ({"corrupted": [1, 2, 10 ** 6, 3, 4, 5, 6]}, "corrupted"),
    ({"answer": "hh"}, "answer"),                     # two tokens
    ({"wrong": "h"}, "wrong"),                        # the answer itself
    ({"wrong": 10 ** 6}, "wrong"),
    ({"kind": "neurons"}, "kind"),
    ({"layers": [0, 7]}, "layers"),
    ({"position": 2}, "position"),                    # positions take no position
    ({"kind": "heads", "position": 99}, "position"),
    ({"attribution": "yes"}, "attribution"),
    ({"logit_attribution": 1}, "logit_attribution"),
    ({"clean": "abc def " * 9, "corrupted": "abd deg " * 9}, "clean"),  # past MAX_TOKENS
])
def test_a_bad_patch_request_is_a_400_naming_its_field(change, field, plain_server):
    reply = call(plain_server.url, "POST", "/v1/patch", {**BODY, **change})
    assert reply.status == 400, reply.text
    assert reply.json()["error"]["param"] == field
    assert call(plain_server.url, "POST", "/v1/patch", {**BODY, "layers": [1]}).status == 200


def test_an_int8_server_patches_exactly_and_refuses_the_estimate_by_name(runs):
    """torch's int8 kernel has no backward: the estimate is a 400 naming 'attribution', the
    exact grid alone is answered (before, a 500: autograd's 'derivative ... not implemented')."""
    from sheepop.inference.load import load
    from sheepop.serve.page.routes import routes
    run = runs[1]
    server = InProcess(load(run, "torch", "cpu", "int8"), routes=routes(run))
    try:
        reply = call(server.url, "POST", "/v1/patch", BODY)
        assert reply.status == 400 and reply.json()["error"]["param"] == "attribution"
        reply = call(server.url, "POST", "/v1/patch", {**BODY, "attribution": False})
        assert reply.status == 200, reply.text
        assert reply.json()["scores"][-1][-1] == 1.0 and "attribution" not in reply.json()
    finally:
        server.close()
