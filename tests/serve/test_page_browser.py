"""The page of `sheepop serve`, driven in a real headless Chromium (Debian's, through Playwright:
no browser download): generate and watch tokens stream in, hover a token for its alternatives
(q, the distribution it was drawn from, beside the model's p), look inside the last generation
(every head of a layer, one enlarged, reading the endpoint's numbers; the sampled distribution
redrawn by its controls and equal to the sampler's; the lens's marks and chart), watch a run's
loss chart grow, at desktop and phone sizes, with no error in the browser's console.
Screenshots go to $SHEEPOP_PAGE_SHOTS (default: a temporary folder); docs/make_page_images.py
puts the best ones into docs/images/."""

import base64
import json
import math
from pathlib import Path

import numpy as np
import pytest
from chromium import needs_chromium, opened
from serve_helpers import ServerProcess, call, weights

from sheepop.checkpoint import format as checkpoint
from sheepop.config.schema import Config, ModelConfig
from sheepop.generation.sample import penalize_repeats, probabilities
from sheepop.tokenizers import train_tokenizer

pytestmark = needs_chromium
PROMPT = "abc def"


def make_run(path: Path) -> Path:
    """A tiny rope model whose head bias keeps it from ever ending (no EOS): every generation
    runs to max_tokens."""
    tok = train_tokenizer("char", ["abcdefgh ijk.\n"])
    cfg = Config()
    cfg.model = ModelConfig(vocab_size=tok.vocab_size, block_size=64, n_layer=2, n_head=2,
                            n_embd=32, pos_encoding="rope", head_bias=True)
    w = weights(cfg.model)
    w["head.bias"][tok.eos_id] = -100.0
    checkpoint.save_checkpoint(path, w, cfg.to_dict(), tok.to_json())
    return path


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """That model on the torch engine, with --runs over a folder holding one training run's
    metrics.jsonl."""
    root = tmp_path_factory.mktemp("page-runs")
    run = make_run(tmp_path_factory.mktemp("page-model") / "model")
    (root / "train-1").mkdir()
    rows = [{"step": s, "loss": 3.2 * 0.9 ** s, "lr": 1e-3 * min(1, (s + 1) / 4)}
            for s in range(0, 40, 2)] + [{"step": 20, "val_loss": 1.2, "val_bpb": 1.9}]
    (root / "train-1/metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with ServerProcess(run, "--engine", "torch", "--runs", str(root)) as s:
        yield s, root


@pytest.fixture
def page(browser, site):
    """A fresh page on the site at 1280x800; at the end, no error in its console."""
    with opened(browser, site[0].url + "/") as pg:
        yield pg


def canvas_pixels(pg, testid: str) -> str:
    return pg.evaluate(f"document.querySelector('[data-testid={testid}]').toDataURL()")


def generate(pg, prompt: str = PROMPT, max_tokens: int = 24, temperature: str = "1",
             top_k: str = "0", top_p: str = "1", min_p: str = "0") -> None:
    pg.get_by_test_id("prompt").fill(prompt)
    pg.fill("#max-tokens", str(max_tokens))
    pg.fill("#temperature", temperature)
    pg.fill("#top-k", top_k)
    pg.fill("#top-p", top_p)  # (the page starts at the server's defaults: 0.95, 0.05)
    pg.fill("#min-p", min_p)
    pg.get_by_test_id("generate").click()
    pg.wait_for_function("document.querySelector('#generate-status').textContent"
                         ".includes('tokens in')")


def test_tokens_stream_in_and_show_their_alternatives(page, shots):
    page.evaluate("""() => {  // the count of tokens at every change of the answer
        window.counts = [];
        new MutationObserver(() => window.counts.push(
            document.querySelectorAll('[data-testid=token]').length))
          .observe(document.querySelector('#answer'), {childList: true}); }""")
    generate(page)
    counts = [c for c in page.evaluate("window.counts") if c > 0]
    tokens = page.get_by_test_id("token")
    assert tokens.count() == 24 and counts[-1] == 24
    assert len(set(counts)) > 1 and counts == sorted(counts)  # it grew while streaming
    probs = [float(p) for p in page.eval_on_selector_all(
        "[data-testid=token]", "nodes => nodes.map(n => n.dataset.prob)")]
    assert all(0 < p <= 1 for p in probs)
    answer = page.inner_text("#answer")
    assert answer.startswith(PROMPT) and len(answer) == len(PROMPT) + 24  # one char a token

    panel = page.get_by_test_id("alternatives")
    assert not panel.is_visible()
    tokens.nth(3).hover()
    assert panel.is_visible()
    rows = panel.locator("tbody tr")
    assert rows.count() == 5  # the top 5 log-probabilities of the API
    shown = [float(t.rstrip("%")) / 100 for t in panel.locator("td.p").all_inner_texts()]
    assert shown == sorted(shown, reverse=True) and sum(shown) <= 1.0001
    # At T = 1 without top-k or top-p, q (drawn from) is the model's p.
    model = [float(t.rstrip("%")) / 100 for t in panel.locator("td.model-p").all_inner_texts()]
    assert model == shown
    for q, p in page.eval_on_selector_all("[data-testid=token]", "nodes => nodes.map(n => "
                                          "[n.dataset.prob, n.dataset.modelProb])"):
        assert abs(float(q) - float(p)) < 2e-6
    page.screenshot(path=str(shots / "page-generate.png"))
    page.mouse.move(5, 5)
    assert not panel.is_visible()
    tokens.nth(5).focus()  # the keyboard reaches the same panel
    assert panel.is_visible()
    page.keyboard.press("Escape")
    assert not panel.is_visible()


def test_the_status_says_how_the_prompt_was_computed(page):
    """The generate view's status gives the prompt's tokens the prefix cache held and the
    chunks the rest was computed in (the site's server: the cache on; nothing else runs, so a
    prompt is computed whole: one chunk)."""
    prompt = "hig fed cba " * 3 + "kji h"  # 41 one-character tokens, in no other test
    status = "document.querySelector('#generate-status').textContent"
    for cached, computed, chunks in [(0, 41, "1 chunk"), (32, 9, "1 chunk")]:
        line = (f"; prompt 41 tokens: {cached} from the prefix cache, {computed} computed "
                f"in {chunks}")
        generate(page, prompt, max_tokens=4)
        page.wait_for_function(f"{status}.endsWith({json.dumps(line)})")
        assert page.inner_text("#generate-status").startswith("4 tokens in ")


def test_the_status_says_how_many_proposed_tokens_were_accepted(browser, tmp_path):
    """On a server started with --speculate, a greedy generation running alone checks tokens
    proposed from its text: the status gives the accepted and proposed counts of its usage,
    the same as the API's for the same request."""
    with ServerProcess(make_run(tmp_path / "model"), "--engine", "numpy", "--speculate", "8",
                       "--cache-mb", "0") as server:
        prompt = "hij kab hij kab hij kab h"
        usage = call(server.url, "POST", "/v1/completions", {
            "prompt": prompt, "max_tokens": 30, "temperature": 0}).json()["usage"]
        details = usage["completion_tokens_details"]
        kept = details["accepted_prediction_tokens"]
        proposed = kept + details["rejected_prediction_tokens"]
        assert kept > 0
        with opened(browser, server.url + "/") as pg:
            generate(pg, prompt, max_tokens=30, temperature="0")
            line = f"; {kept} of {proposed} proposed tokens accepted; prompt 25 tokens"
            assert line in pg.inner_text("#generate-status")


def inspected(url: str, body: dict) -> dict:
    r = call(url, "POST", "/v1/inspect", body)
    assert r.status == 200, r.text
    return r.json()


def test_inside_reads_the_last_generation_and_shows_every_head(page, site, shots):
    generate(page, max_tokens=4)
    page.get_by_test_id("view-inside").click()
    page.wait_for_selector("[data-testid=logit-lens] tbody tr")
    analysed = PROMPT + page.inner_text("#answer")[len(PROMPT):]
    assert page.input_value("#inside-prompt") == analysed  # the prompt and the 4 generated
    answer = inspected(site[0].url, {"prompt": analysed})
    T = len(answer["tokens"])
    assert T == len(PROMPT) + 4
    heatmap = page.get_by_test_id("attention")
    assert (heatmap.get_attribute("data-layer"), heatmap.get_attribute("data-head")) == ("0", "0")
    thumbs = page.get_by_test_id("head-thumb")
    assert thumbs.count() == 2 and thumbs.nth(0).get_attribute("aria-pressed") == "true"
    seen = {canvas_pixels(page, "attention")}
    thumbs.nth(1).click()  # a small head, enlarged
    assert heatmap.get_attribute("data-head") == "1"
    assert page.get_by_test_id("head").input_value() == "1"
    assert thumbs.nth(1).get_attribute("aria-pressed") == "true"
    seen.add(canvas_pixels(page, "attention"))
    page.get_by_test_id("layer").select_option("1")
    assert heatmap.get_attribute("data-layer") == "1"
    seen.add(canvas_pixels(page, "attention"))
    assert len(seen) == 3  # three different pictures
    assert page.get_by_test_id("logit-lens").locator("tbody tr").count() == 3  # h_0, h_1, h_2
    assert page.locator("#attention-legend .tick").all_inner_texts() == ["0", "0.25", "0.5",
                                                                         "0.75", "1"]

    # The number under the pointer is the endpoint's: layer 2, head 2, last query, first key.
    heatmap.scroll_into_view_if_needed()
    box = heatmap.bounding_box()
    margin, cell = (float(heatmap.get_attribute(f"data-{k}")) for k in ("margin", "cell"))
    page.mouse.move(box["x"] + margin + cell / 2, box["y"] + margin + (T - 0.5) * cell)
    readout = page.inner_text("#attention-readout")
    assert readout.endswith(f"A = {answer['attention']['weights'][1][1][T - 1][0]:.7f}")
    page.get_by_test_id("attention").focus()
    page.keyboard.press("ArrowUp")
    assert f"query {T - 2} " in page.inner_text("#attention-readout")
    page.screenshot(path=str(shots / "page-inside.png"), full_page=True)


def test_a_long_prompt_keeps_a_label_for_every_token_and_fits_a_phone(page, site):
    """60 tokens (the heatmap used to drop its labels past 48): 8-px cells at least, every token
    labelled, the heatmap scrolling in its own box so the page stays 390 px wide."""
    long = ("abc def ghi jk. " * 4)[:60]
    page.set_viewport_size({"width": 390, "height": 844})
    page.get_by_test_id("view-inside").click()
    page.fill("#inside-prompt", long)
    page.click("#analyse-button")
    page.wait_for_function("document.querySelector('[data-testid=logit-lens]')"
                           ".querySelectorAll('thead th').length === 61")
    heatmap = page.get_by_test_id("attention")
    assert float(heatmap.get_attribute("data-cell")) >= 8
    assert heatmap.get_attribute("data-label-every") == "1"
    assert page.evaluate("document.documentElement.scrollWidth") <= 390


def test_the_sampled_distribution_is_the_samplers_and_follows_its_controls(page, site, shots):
    """At the picked position: p is /v1/inspect's, q is what sheepop.generation.sample computes
    from the same logits (1e-9); top-k 3 keeps 3 tokens summing to 1; moving the temperature
    redraws it."""
    generate(page, max_tokens=6, temperature="0.8", top_k="3")
    page.get_by_test_id("view-inside").click()
    summary = page.get_by_test_id("sampled-summary")
    page.wait_for_function("document.querySelector('[data-testid=sampled-summary]')"
                           ".dataset.position !== undefined")
    assert page.input_value("#s-top-k") == "3"  # the Generate view's settings
    t = int(summary.get_attribute("data-position"))
    text = page.input_value("#inside-prompt")
    answer = inspected(site[0].url, {"prompt": text, "logits_at": t, "lens": False})
    z = np.frombuffer(base64.b64decode(answer["logits"]["float32"]), dtype="<f4")
    ids = [tok["id"] for tok in answer["tokens"]]

    def rows() -> dict[int, tuple[float, float]]:
        return {int(i): (float(p), float(q)) for i, p, q in page.eval_on_selector_all(
            "[data-testid=sampled] tbody tr",
            "rows => rows.map(r => [r.dataset.id, r.dataset.p, r.dataset.q])")}

    def check(temperature: float, k: int, penalty: float = 1.0, min_p: float = 0.0,
              kept: int | None = None) -> None:
        assert int(summary.get_attribute("data-kept")) == (k if kept is None else kept)
        assert abs(float(summary.get_attribute("data-sum")) - 1) < 1e-9
        seen = np.zeros(len(z), dtype=bool)
        seen[ids[:t + 1]] = True
        q = probabilities(penalize_repeats(z, seen, penalty), temperature, k, 1.0, min_p)
        p = probabilities(z.astype(np.float64))
        for i, (shown_p, shown_q) in rows().items():
            assert math.isclose(shown_q, q[i], abs_tol=1e-9), (i, shown_q, q[i])
            assert math.isclose(shown_p, p[i], abs_tol=1e-9)
        if (k if kept is None else kept) <= 12:  # every kept token is listed
            assert sum(q for _, q in rows().values()) == pytest.approx(1, abs=1e-8)

    check(0.8, 3)
    first = dict(zip(answer["next"]["ids"][t], answer["next"]["probs"][t]))
    for i, prob in first.items():  # the model's p: /v1/inspect's own numbers
        assert math.isclose(rows()[i][0], prob, abs_tol=1e-6)
    assert page.locator("[data-testid=sampled] tr.chosen").get_attribute("data-id") == \
        str(ids[t + 1])
    before = rows()
    page.fill("#s-temperature", "1.5")
    page.dispatch_event("#s-temperature", "input")
    assert rows() != before  # redrawn
    check(1.5, 3)
    page.fill("#s-top-k", "0")
    page.dispatch_event("#s-top-k", "input")
    page.fill("#s-penalty", "1.5")
    page.dispatch_event("#s-penalty", "input")
    check(1.5, len(z) - len(answer["never_generate"]), 1.5)
    # min-p 0.3 (issue 41): q keeps the tokens at least 0.3 times as likely as the likeliest
    page.fill("#s-min-p", "0.3")
    page.dispatch_event("#s-min-p", "input")
    seen = np.zeros(len(z), dtype=bool)
    seen[ids[:t + 1]] = True
    kept = int((probabilities(penalize_repeats(z, seen, 1.5), 1.5, 0, 1.0, 0.3) > 0).sum())
    assert 1 <= kept < len(z) - len(answer["never_generate"])
    check(1.5, 0, 1.5, 0.3, kept)
    page.screenshot(path=str(shots / "page-sampled.png"), full_page=True)


def test_the_lens_marks_its_right_cells_and_charts_each_layer(page, site):
    generate(page, max_tokens=8)
    page.get_by_test_id("view-inside").click()
    page.wait_for_selector("[data-testid=logit-lens] tbody tr")
    answer = inspected(site[0].url, {"prompt": page.input_value("#inside-prompt")})
    lens, ids = answer["lens"], [t["id"] for t in answer["tokens"]]
    right = [[int(t + 1 < len(ids) and lens["ids"][layer][t][0] == ids[t + 1])
              for t in range(len(ids))] for layer in range(len(lens["layers"]))]
    shown = page.eval_on_selector_all(
        "[data-testid=logit-lens] tbody tr",
        "rows => rows.map(r => [...r.querySelectorAll('td')].map(c => Number(c.dataset.hit)))")
    assert shown == right
    assert int(page.get_by_test_id("logit-lens").get_attribute("data-hits")) == sum(map(sum, right))
    # The picked position (the one before the last): entropy and KL of 3 layers, p of 3.
    assert page.get_by_test_id("lens-nats").get_attribute("data-points") == "6"
    assert page.get_by_test_id("lens-next").get_attribute("data-points") == "3"
    t = len(ids) - 2
    assert page.locator("#lens-chart-caption").inner_text().endswith(
        " ".join(f"{layer}:{lens['rank'][layer][t]}" for layer in range(3)))
    assert lens["kl"][-1][t] < 1e-6
    assert page.locator("#lens-embedding").is_visible()  # a tied head: why row 0 reads its input


def test_the_loss_chart_draws_a_run_and_grows_with_its_metrics(page, site, shots):
    page.get_by_test_id("view-runs").click()
    chart = page.get_by_test_id("loss-chart")
    page.wait_for_function("Number(document.querySelector('[data-testid=loss-chart]')"
                           ".dataset.points) === 21")
    before = canvas_pixels(page, "loss-chart")
    with open(site[1] / "train-1/metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 40, "loss": 0.05, "lr": 1e-4}) + "\n")
    page.wait_for_function("Number(document.querySelector('[data-testid=loss-chart]')"
                           ".dataset.points) === 22")  # polled every 2 s
    assert canvas_pixels(page, "loss-chart") != before
    assert chart.get_attribute("data-points") == "22"
    page.screenshot(path=str(shots / "page-runs.png"), full_page=True)


def test_the_views_fit_a_phone_and_the_tabs_take_the_keyboard(page, shots):
    page.set_viewport_size({"width": 390, "height": 844})
    generate(page, max_tokens=8)
    page.get_by_test_id("view-generate").focus()
    views = page.eval_on_selector_all("[role=tab]", "tabs => tabs.map(t => t.dataset.view)")
    assert views[:3] == ["generate", "inside", "runs"]
    for view in views[1:] + views[:1]:  # each view in turn, back to the first
        page.keyboard.press("ArrowRight")
        assert page.get_by_test_id(f"view-{view}").get_attribute("aria-selected") == "true"
        assert page.evaluate("document.activeElement.dataset.view") == view
        if view == "inside":
            page.wait_for_selector("[data-testid=logit-lens] tbody tr")
            page.wait_for_selector("[data-testid=sampled] tbody tr")
        overflow = page.evaluate("document.documentElement.scrollWidth")
        assert overflow <= 390, f"{view}: the page is {overflow} px wide on a 390 px screen"
        page.screenshot(path=str(shots / f"page-{view}-phone.png"), full_page=True)


def test_a_chat_model_gets_a_conversation_and_inside_reads_it(browser, runs, shots):
    """The chat run (its template) without an API key: two turns, then the inside view analyses
    the whole templated conversation, as /v1/inspect does with the same messages."""
    with ServerProcess(runs[0]) as server, \
            opened(browser, server.url + "/", ready="chat") as pg:
        pg.fill("#max-tokens", "6")
        for message in ("abc", "def"):
            pg.get_by_test_id("prompt").fill(message)
            pg.get_by_test_id("generate").click()
            pg.wait_for_function("!document.querySelector('#generate-button').disabled && "
                                 "document.querySelector('#generate-status').textContent"
                                 ".includes('tokens in')")
        turns = pg.locator("#conversation .turn")
        assert turns.count() == 4
        assert turns.nth(2).inner_text() == "user:def"
        reply = [t.removeprefix("assistant:") for t in turns.all_inner_texts()[1::2]]
        generated = pg.get_by_test_id("token").count()  # the last answer's tokens
        pg.get_by_test_id("view-inside").click()
        pg.wait_for_selector("[data-testid=logit-lens] tbody tr")
        messages = [{"role": "user", "content": "abc"}, {"role": "assistant", "content": reply[0]},
                    {"role": "user", "content": "def"}]
        answer = call(server.url, "POST", "/v1/inspect", {"messages": messages}).json()
        columns = pg.get_by_test_id("logit-lens").locator("thead th").count() - 1
        # The whole templated conversation and the answer generated after it, shown in the box.
        assert columns == len(answer["tokens"]) + generated and generated > 0
        box = pg.input_value("#inside-prompt")
        assert box.startswith("".join(t["text"] for t in answer["tokens"]))
        assert box.endswith(reply[1])
        pg.screenshot(path=str(shots / "page-chat.png"), full_page=True)


def test_a_server_with_an_api_key_serves_the_page_which_asks_for_the_key(browser, server):
    """The page's files are open; its API calls carry the key the user types (401 without)."""
    from serve_helpers import KEY
    assert call(server.url, "GET", "/").status == 200
    assert call(server.url, "GET", "/static/page.js").status == 200
    assert call(server.url, "GET", "/v1/inspect").status == 401
    with opened(browser, server.url + "/", ready="API key") as pg:
        pg.expected_errors.append("Failed to load resource: the server responded with a "
                                  "status of 401 (Unauthorized)")  # (the first call, keyless)
        pg.get_by_test_id("api-key").fill(KEY)
        pg.get_by_test_id("api-key").press("Enter")  # the page reloads: `?.` until it is back
        pg.wait_for_function("document.querySelector('#model-line')?.textContent"
                             ".includes('layers')")
        assert pg.get_by_test_id("api-key").input_value() == KEY  # kept for the tab
