"""The page of `sheepop serve` and its `/v1/inspect` on a real model: SmolLM2-135M-Instruct (30
layers, 9 heads, a 49,152-token vocabulary) imported from its GGUF file. The endpoint answers a
64-token prompt with every layer and head, its next token after "The capital of France is" is
" Paris", and the page's inside view draws it in Chromium (Debian's, through Playwright; skipped
without it, as tests/serve/test_page_browser.py is). Screenshots go to $SHEEPOP_PAGE_SHOTS
(default: a temporary folder); `page-smollm2.png` is docs/images/page-smollm2.png.

The first test is not the real model's: the lens's top-k and probabilities (a partition and k + 1
exponentials a row, sheepop.arch.inspection.distribution) against a full softmax and a stable
argsort over a vocabulary of that size."""

from __future__ import annotations

import numpy as np
import pytest
from chromium import needs_chromium, opened
from serve_helpers import ServerProcess, call

from sheepop.arch.inspection import distribution
from sheepop.softmax import softmax

CAPITAL = "The capital of France is"
PAGE_PROMPT = "The capital of France is Paris. The capital of Germany is"
TEXT = ("The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy "
        "is Rome. The capital of Spain is Madrid. ") * 4
WAIT_MS = 120_000  # the logit lens of 31 layers takes ~4 s on one busy core


def test_the_lens_top_k_equals_a_full_softmax_and_sort_on_a_49k_vocabulary():
    rng = np.random.default_rng(3)
    logits = (rng.normal(size=(6, 49_152)) * 4).astype(np.float32)
    logits[2, [7, 40_000, 123]] = logits[2].max() + 1  # a three-way tie for the top: ids order
    logits[4, :] = 0.5  # all tied
    ids = [5, 49_151, 0, 17, 9, 4]
    rows, _ = distribution(logits.copy(), np.array(ids[1:] + [-1]), 5)
    top, following = rows.top, rows.following
    p = softmax(logits.astype(np.float64))
    order = np.argsort(-p, axis=-1, kind="stable")[:, :5]
    np.testing.assert_array_equal(top.ids, order)
    assert top.ids[2, :3].tolist() == [7, 123, 40_000] and top.ids[4].tolist() == [0, 1, 2, 3, 4]
    np.testing.assert_allclose(top.probs, np.take_along_axis(p, order, -1), rtol=1e-6, atol=0)
    np.testing.assert_allclose(following[:-1], p[np.arange(5), ids[1:]], rtol=1e-6, atol=0)
    assert np.isnan(following[-1])


@pytest.fixture(scope="module")
def smol(smollm2_run):
    with ServerProcess(smollm2_run, "--engine", "torch") as s:
        yield s


@pytest.mark.real_model
def test_inspect_answers_a_64_token_prompt_with_30_layers_and_9_heads(smol):
    shape = call(smol.url, "GET", "/v1/inspect").json()
    assert (shape["n_layer"], shape["n_head"], shape["n_kv_head"], shape["vocab_size"]) == \
        (30, 9, 3, 49_152) and shape["chat"]
    # The text's first 64 ids, as the server's tokenizer gives them.
    first = call(smol.url, "POST", "/v1/inspect", {"prompt": TEXT, "layers": [], "lens": False})
    ids = [t["id"] for t in first.json()["tokens"]][:64]
    assert len(ids) == 64
    reply = call(smol.url, "POST", "/v1/inspect", {"prompt": ids})
    assert reply.status == 200, reply.text[:300]
    x = reply.json()
    assert (x["n_layer"], x["n_head"], x["attention"]["layers"]) == (30, 9, list(range(30)))
    weights = x["attention"]["weights"]
    assert len(weights) == 30 and all(len(layer) == 9 for layer in weights)
    for head in (weights[0][0], weights[29][8]):  # row t: query t over keys 0..t, summing to 1
        assert [len(row) for row in head] == list(range(1, 65))
        np.testing.assert_allclose([sum(row) for row in head], 1, atol=1e-5)
    lens = x["lens"]
    assert lens["layers"] == ["embedding"] + [f"block {i}" for i in range(1, 31)]
    assert np.shape(lens["ids"]) == (31, 64, 5)
    assert lens["ids"][-1] == x["next"]["ids"] and lens["probs"][-1] == x["next"]["probs"]
    # Causality: the first 5 tokens ("The capital of France is") read alone give the same
    # attention rows and the same next token at each of their positions.
    alone = call(smol.url, "POST", "/v1/inspect", {"prompt": ids[:5], "layers": [0, 29],
                                                   "lens": False}).json()
    for mine, theirs in zip((weights[0], weights[29]), alone["attention"]["weights"]):
        for h in range(9):
            for t in range(5):
                np.testing.assert_allclose(mine[h][t], theirs[h][t], atol=1e-5)
    assert x["next"]["ids"][:5] == alone["next"]["ids"]
    np.testing.assert_allclose(x["next"]["probs"][:5], alone["next"]["probs"], atol=1e-5)
    assert x["next"]["texts"][4][0] == " Paris" and x["tokens"][5]["text"] == " Paris"
    assert x["next"]["next_prob"][4] == x["next"]["probs"][4][0]


@pytest.mark.real_model
def test_the_next_token_after_the_capital_of_france_is_paris(smol):
    x = call(smol.url, "POST", "/v1/inspect", {"prompt": CAPITAL, "layers": [],
                                               "lens": False}).json()
    assert [t["text"] for t in x["tokens"]] == ["The", " capital", " of", " France", " is"]
    assert x["next"]["texts"][-1][0] == " Paris"
    assert "lens" not in x and x["attention"]["weights"] == []


@pytest.mark.real_model
@needs_chromium
def test_the_inside_view_draws_smollm2_in_chromium(smol, browser, shots):
    with opened(browser, smol.url + "/", ready="30 layers, 9 heads", wait_ms=WAIT_MS) as pg:
        # A chat model: the question goes through its own ChatML template.
        pg.get_by_test_id("prompt").fill("What is the capital of France?")
        pg.fill("#max-tokens", "7")
        pg.fill("#temperature", "0")
        pg.get_by_test_id("generate").click()
        pg.wait_for_function("document.querySelector('#generate-status').textContent"
                             ".includes('tokens in')")
        assert pg.locator("#conversation .turn").all_inner_texts() == [
            "user:What is the capital of France?",
            "assistant:The capital of France is Paris."]

        # The inside view starts on that conversation; another prompt overtakes it.
        pg.get_by_test_id("view-inside").click()
        assert pg.locator("#layer option").count() == 30
        assert pg.locator("#head option").count() == 9
        pg.fill("#inside-prompt", PAGE_PROMPT)
        pg.click("#analyse-button")
        pg.wait_for_function("document.querySelector('#inside-status').textContent === "
                             "'12 tokens, 30 layers × 9 heads'")
        lens = pg.get_by_test_id("logit-lens")
        assert lens.locator("tbody tr").count() == 31  # the embedding and 30 blocks
        assert lens.locator("thead th").all_inner_texts()[1:] == [
            "The", "␣capital", "␣of", "␣France", "␣is", "␣Paris", ".", "␣The", "␣capital",
            "␣of", "␣Germany", "␣is"]
        assert lens.locator("tbody tr").last.locator("td").last.inner_text() == "␣Berlin"
        assert pg.locator("#next-bars td").first.inner_text() == "␣Berlin"

        # Layer 12's head 2 (read from the server when chosen) looks at the token before.
        pg.get_by_test_id("head").select_option("1")
        pg.get_by_test_id("layer").select_option("11")
        pg.wait_for_function("document.querySelector('[data-testid=attention]')"
                             ".dataset.layer === '11'")
        heatmap = pg.get_by_test_id("attention")
        margin, cell = (float(heatmap.get_attribute(f"data-{k}")) for k in ("margin", "cell"))
        heatmap.scroll_into_view_if_needed()
        box = heatmap.bounding_box()
        pg.mouse.move(box["x"] + margin + 10.5 * cell, box["y"] + margin + 11.5 * cell)
        answer = call(smol.url, "POST", "/v1/inspect", {"prompt": PAGE_PROMPT, "layers": [11],
                                                        "lens": False}).json()
        weight = answer["attention"]["weights"][0][1][11][10]
        assert pg.inner_text("#attention-readout") == (
            f'layer 12, head 2: query 11 " is" → key 10 " Germany": A = {weight:.7f}')
        assert pg.inner_text("#inside-status") == "12 tokens, 30 layers × 9 heads"
        pg.mouse.move(5, 5)
        pg.evaluate("window.scrollTo(0, document.querySelector('#attention').closest('.panel')"
                    ".offsetTop - 64)")
        pg.screenshot(path=str(shots / "page-smollm2.png"))
        pg.evaluate("window.scrollTo(0, document.querySelector('#logit-lens')"
                    ".closest('.panel').offsetTop - 8)")
        pg.screenshot(path=str(shots / "page-smollm2-lens.png"))
