"""The page's Step view (one token through every step of docs/math, POST /v1/trace) and Backprop
view (one training step backwards, POST /v1/backward), driven in Debian's Chromium through
Playwright as tests/serve/test_page_browser.py does: the numbers shown are the engine's own
(the softmax row is /v1/inspect's attention row, the next-token p its distribution, top-k keeps k
tokens summing to 1, the loss and the gradient norms torch autograd's), the position, layer,
head and sampling controls redraw, no console error, and the phone size holds. Screenshots go to
$SHEEPOP_PAGE_SHOTS (default: a temporary folder). The last test runs on SmolLM2 (real_model)."""

from __future__ import annotations

import math
import re
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from chromium import needs_chromium, opened
from serve_helpers import ServerProcess, call, weights
from variants import gqa, llama

from sheepop.checkpoint import format as checkpoint
from sheepop.config.schema import Config, ModelConfig
from sheepop.model import GPT
from sheepop.tokenizers import train_tokenizer

pytestmark = needs_chromium
PROMPT = "abc def"
GENERATED = 6


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A tiny Llama-shaped model (RoPE, RMSNorm, SwiGLU, 4 heads sharing 2 key/value heads)
    whose head bias keeps it from ending (no EOS): every generation runs to max_tokens."""
    tok = train_tokenizer("char", ["abcdefgh ijk.\n"])
    cfg = Config()
    cfg.model = ModelConfig(vocab_size=tok.vocab_size, block_size=64, n_layer=2, n_embd=32,
                            head_bias=True, **llama(**gqa(4, 2)))
    w = weights(cfg.model)
    w["head.bias"][tok.eos_id] = -100.0
    path = tmp_path_factory.mktemp("step-model") / "model"
    checkpoint.save_checkpoint(path, w, cfg.to_dict(), tok.to_json())
    return path


@pytest.fixture(scope="module")
def site(run):
    with ServerProcess(run, "--engine", "torch") as s:
        yield s


@pytest.fixture
def page(browser, site):
    with opened(browser, site.url + "/") as pg:
        yield pg


def generate(pg, prompt: str = PROMPT, max_tokens: int = GENERATED) -> list[str]:
    pg.get_by_test_id("prompt").fill(prompt)
    pg.fill("#max-tokens", str(max_tokens))
    pg.get_by_test_id("generate").click()
    pg.wait_for_function("document.querySelector('#generate-status').textContent"
                         ".includes('tokens in')")
    return pg.eval_on_selector_all("#answer [data-testid=token]",
                                   "nodes => nodes.map(n => n.textContent)")


def traced(pg, position: int) -> None:
    """Wait until the Step view shows `position`."""
    pg.wait_for_function(f"document.querySelector('#step-status').textContent"
                         f".includes('position {position},')")


def shown_column(pg, table: str, selector: str) -> list[float]:
    return [float(v) for v in pg.eval_on_selector_all(
        f"[data-testid={table}] {selector}", "cells => cells.map(c => c.dataset.value ?? "
                                              "c.dataset.p)")]


def softmax_row(pg) -> list[float]:
    return shown_column(pg, "step-softmax", "td.a")


def test_step_shows_the_engines_numbers_and_follows_position_layer_head(page, site, shots):
    generated = generate(page)
    assert len(generated) == GENERATED
    page.get_by_test_id("view-step").click()
    tokens = page.get_by_test_id("step-token")
    T = len(PROMPT) + GENERATED  # one character a token
    traced(page, T - 1)  # the last token, a generated one, by default
    assert tokens.count() == T
    assert page.eval_on_selector_all("[data-testid=step-token].generated", "n => n.length") == \
        GENERATED
    answer = call(site.url, "POST", "/v1/trace", {"prompt": PROMPT, "continuation": generated})
    ids = [t["id"] for t in answer.json()["tokens"]]
    assert len(ids) == T
    inspected = call(site.url, "POST", "/v1/inspect", {"prompt": ids}).json()
    attention = inspected["attention"]["weights"]  # [layer][head][query][key]

    def check(layer: int, head: int, t: int) -> None:
        row = softmax_row(page)
        assert len(row) == T and all(v == 0 for v in row[t + 1:])  # the mask: no future
        np.testing.assert_allclose(row[:t + 1], attention[layer][head][t], atol=1e-5)

    check(0, 0, T - 1)
    before = softmax_row(page)
    page.get_by_test_id("step-head").select_option("2")  # redrawn at once, no request
    check(0, 2, T - 1)
    assert softmax_row(page) != before
    page.get_by_test_id("step-layer").select_option("1")
    page.wait_for_function("document.querySelector('#step-status').textContent"
                           ".includes('layer 2 of 2')")
    check(1, 2, T - 1)
    tokens.nth(3).click()  # a prompt token
    traced(page, 3)
    assert tokens.nth(3).get_attribute("aria-pressed") == "true"
    check(1, 2, 3)
    # The next-token probabilities p = softmax(z_t) are /v1/inspect's (its top 5 at t = 3).
    shown = dict(zip(page.eval_on_selector_all("[data-testid=step-sampling] tbody tr",
                                               "rows => rows.map(r => Number(r.dataset.id))"),
                     shown_column(page, "step-sampling", "td:nth-child(3)")))
    for i, p in zip(inspected["next"]["ids"][3], inspected["next"]["probs"][3]):
        assert math.isclose(shown[i], p, rel_tol=1e-5)
    assert "The text goes on with" in page.inner_text("[data-testid=step-draw]")
    page.screenshot(path=str(shots / "page-step.png"))
    page.screenshot(path=str(shots / "page-step-full.png"), full_page=True)

    # Top-k 3: three tokens keep all the mass; top-p 0.5 then keeps fewer or as many.
    page.fill("#step-top-k", "3")
    page.press("#step-top-k", "Enter")
    page.wait_for_function("document.querySelector('[data-testid=step-sampling] th:nth-child(5)')"
                           ".textContent.includes('k = 3')")
    after_k = shown_column(page, "step-sampling", "td:nth-child(5)")
    assert sum(p > 0 for p in after_k) == 3 and math.isclose(sum(after_k), 1, rel_tol=1e-9)
    tau = shown_column(page, "step-sampling", "td:nth-child(4)")
    kept = sorted(range(len(tau)), key=lambda i: -tau[i])[:3]
    assert {i for i, p in enumerate(after_k) if p > 0} == set(kept)
    page.fill("#step-top-p", "0.5")
    page.press("#step-top-p", "Enter")
    page.wait_for_function("document.querySelector('[data-testid=step-sampling] th:nth-child(6)')"
                           ".textContent.includes('p = 0.5')")
    final = shown_column(page, "step-sampling", "td:nth-child(6)")
    assert 1 <= sum(p > 0 for p in final) <= 3 and math.isclose(sum(final), 1, rel_tol=1e-9)
    # The whole logit vector is a click away.
    page.get_by_role("button", name=re.compile(r"all \d+ logits")).click()
    page.wait_for_selector(".vec[data-name='z_t (every logit)']")
    assert page.get_attribute(".vec[data-name='z_t (every logit)']", "data-size") == \
        str(answer.json()["shape"]["vocab_size"])


def autograd(run: Path, ids: list[int]) -> tuple[float, dict[str, float], dict[str, float]]:
    """The loss, each layer's and each weight's gradient norm by torch autograd on the run's
    weights."""
    from sheepop.inference.load import read_run
    cfg, _, w = read_run(run)
    model = GPT(cfg.model)
    model.load_numpy_weights(w)
    _, loss = model(torch.tensor([ids[:-1]]), torch.tensor([ids[1:]]))[:2]
    loss.backward()
    squares: dict[str, float] = {}
    each = {}
    for name, p in model.named_parameters():
        each[name] = float(p.grad.double().norm())
        found = re.match(r"blocks\.(\d+)\.", name)
        layer = (f"block {int(found.group(1)) + 1}" if found else "final norm and head"
                 if name.startswith(("ln_f.", "head.")) else "embedding")
        squares[layer] = squares.get(layer, 0.0) + float((p.grad.double() ** 2).sum())
    return float(loss.detach()), {k: math.sqrt(v) for k, v in squares.items()}, each


def test_backprop_shows_the_loss_dz_and_the_gradients_autograd_gives(page, site, run, shots):
    page.get_by_test_id("view-backward").click()
    page.fill("#backward-prompt", "abc def gh")
    page.get_by_test_id("backward-run").click()
    page.wait_for_selector("[data-testid=backward-grads] tbody tr")
    ids = [t["id"] for t in call(site.url, "POST", "/v1/backward",
                                 {"prompt": "abc def gh"}).json()["tokens"]]
    loss, norms, each = autograd(run, ids)
    shown_loss = float(page.get_attribute("[data-testid=backward-loss]", "data-loss"))
    assert math.isclose(shown_loss, loss, rel_tol=1e-5)
    layers = page.eval_on_selector_all("[data-testid=backward-grads] tbody tr",
                                       "rows => rows.map(r => [r.dataset.layer, "
                                       "Number(r.dataset.norm)])")
    assert [name for name, _ in layers] == ["embedding", "block 1", "block 2",
                                            "final norm and head"]
    for name, norm in layers:
        assert math.isclose(norm, norms[name], rel_tol=1e-5), name
    # A layer's row opens its weights, each its own gradient's norm
    page.locator("[data-testid=backward-grads] tbody tr[data-layer='block 2']").click()
    weights = page.eval_on_selector_all("[data-testid=backward-weights-table] tr",
                                        "rows => rows.map(r => [r.dataset.name, "
                                        "Number(r.dataset.norm)])")
    assert [name for name, _ in weights] == [n for n in each if n.startswith("blocks.1.")]
    for name, norm in weights:
        assert math.isclose(norm, each[name], rel_tol=1e-5), name
    # dZ's row: the target's entry is (p - 1)/N, the others p/N
    n = len(ids) - 1
    dz = shown_column(page, "backward-dz", "td.dz")
    ps = [float(t.rstrip("%")) / 100 for t in page.eval_on_selector_all(
        "[data-testid=backward-dz] tbody td:nth-child(2)", "c => c.map(x => x.textContent)")]
    assert dz[0] < 0 and all(v > 0 for v in dz[1:])
    assert math.isclose(dz[0], (ps[0] - 1) / n, rel_tol=1e-2, abs_tol=1e-4)
    page.screenshot(path=str(shots / "page-backward.png"))
    page.get_by_test_id("backward-token").nth(2).click()  # another position's row
    page.wait_for_function("document.querySelector('[data-testid=backward-token]:nth-child(3)')"
                           ".getAttribute('aria-pressed') === 'true'")
    assert shown_column(page, "backward-dz", "td.dz") != dz


def test_the_new_views_fit_a_phone(browser, site, shots):
    with opened(browser, site.url + "/", 390, 844) as pg:
        generate(pg, max_tokens=4)
        for view in ("step", "backward"):
            pg.get_by_test_id(f"view-{view}").click()
            pg.wait_for_selector("[data-testid=step-softmax]" if view == "step"
                                 else "[data-testid=backward-grads] tbody tr")
            if view == "step":
                pg.click("#step .more")  # a long vector opened in full still fits
            width = pg.evaluate("document.documentElement.scrollWidth")
            assert width <= 390, f"{view}: the page is {width} px wide on a 390 px screen"
            pg.screenshot(path=str(shots / f"page-{view}-phone.png"))


@pytest.mark.real_model
def test_step_on_smollm2(browser, smollm2_run, shots):
    """SmolLM2 (30 layers, 9 heads of which 3 key/value, RMSNorm, SwiGLU, RoPE): the trace's
    softmax row is /v1/inspect's, its next token after the question is the model's, and the
    page draws it with 30 layers and 9 heads. The request time is printed (-s shows it)."""
    with ServerProcess(smollm2_run, "--engine", "numpy") as s:  # starts without importing torch
        prompt = "The capital of France is"
        started = time.perf_counter()
        x = call(s.url, "POST", "/v1/trace", {"prompt": prompt, "layer": 12}).json()
        took = time.perf_counter() - started
        print(f"\nSmolLM2 /v1/trace, {len(x['tokens'])} tokens, layer 12: {took:.3f} s "
              f"(server {x['seconds']:.3f} s)")
        ids = [t["id"] for t in x["tokens"]]
        seen = call(s.url, "POST", "/v1/inspect", {"prompt": ids, "layers": [12],
                                                   "lens": False}).json()
        for h in range(9):
            np.testing.assert_allclose(x["block"]["heads"][h]["weights"],
                                       seen["attention"]["weights"][0][h][-1], atol=1e-5)
        assert x["logits"]["top"][0]["id"] == seen["next"]["ids"][-1][0]
        assert x["logits"]["top"][0]["text"] == " Paris"
        with opened(browser, s.url + "/") as pg:
            pg.set_default_timeout(120_000)
            pg.get_by_test_id("view-step").click()
            pg.fill("#step-prompt", prompt)
            pg.click("#step-form button")
            pg.wait_for_selector("[data-testid=step-softmax]")
            assert pg.get_by_test_id("step-layer").locator("option").count() == 30
            assert pg.get_by_test_id("step-head").locator("option").count() == 9
            pg.get_by_test_id("step-layer").select_option("12")  # (from 0, as the API's)
            pg.wait_for_function("document.querySelector('#step-status').textContent"
                                 ".includes('layer 13 of 30')")
            pg.get_by_test_id("step-head").select_option("1")
            np.testing.assert_allclose(softmax_row(pg), seen["attention"]["weights"][0][1][-1],
                                       atol=1e-5)
            pg.screenshot(path=str(shots / "page-step-smollm2.png"))
