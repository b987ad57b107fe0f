"""The page of `sheepop serve`, driven in a real headless Chromium (Debian's, through Playwright:
no browser download): generate and watch tokens stream in, hover a token for its alternatives,
look inside the last prompt (the heatmap changes with the layer and head and reads the
endpoint's numbers), watch a run's loss chart grow, at desktop and phone sizes, with no error in
the browser's console. Screenshots go to $SHEEPOP_PAGE_SHOTS (default: a temporary folder);
docs/make_page_images.py puts the best ones into docs/images/."""

import json
import os
import shutil
import signal
from pathlib import Path

import pytest
from serve_helpers import ServerProcess, call, weights

from sheepop.checkpoint import format as checkpoint
from sheepop.config.schema import Config, ModelConfig
from sheepop.tokenizers import train_tokenizer

playwright = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium: `make system-deps` "
                                "installs it (apt-get install chromium)")
WAIT_MS = 20_000
PROMPT = "abc def"


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    where = os.environ.get("SHEEPOP_PAGE_SHOTS")
    path = Path(where) if where else tmp_path_factory.mktemp("shots")
    path.mkdir(parents=True, exist_ok=True)
    return path


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
    s = ServerProcess(run, "--engine", "torch", "--runs", str(root))
    yield s, root
    assert s.stop(signal.SIGTERM) == 0


@pytest.fixture(scope="module")
def browser():
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def page(browser, site):
    """A fresh page on the site at 1280x800; at the end, no error in its console."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    pg = context.new_page()
    errors: list[str] = []
    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.set_default_timeout(WAIT_MS)
    pg.goto(site[0].url + "/")
    pg.wait_for_function("document.querySelector('#model-line').textContent.includes('layers')")
    yield pg
    context.close()
    assert errors == []


def canvas_pixels(pg, testid: str) -> str:
    return pg.evaluate(f"document.querySelector('[data-testid={testid}]').toDataURL()")


def generate(pg, prompt: str = PROMPT, max_tokens: int = 24) -> None:
    pg.get_by_test_id("prompt").fill(prompt)
    pg.fill("#max-tokens", str(max_tokens))
    pg.fill("#temperature", "1")
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
    rows = panel.locator("tr")
    assert rows.count() == 5  # the top 5 log-probabilities of the API
    shown = [float(t.rstrip("%")) / 100 for t in panel.locator("td.p").all_inner_texts()]
    assert shown == sorted(shown, reverse=True) and sum(shown) <= 1.0001
    page.screenshot(path=str(shots / "page-generate.png"))
    page.mouse.move(5, 5)
    assert not panel.is_visible()
    tokens.nth(5).focus()  # the keyboard reaches the same panel
    assert panel.is_visible()
    page.keyboard.press("Escape")
    assert not panel.is_visible()


def test_inside_reads_the_last_prompt_and_the_heatmap_follows_layer_and_head(page, site, shots):
    generate(page, max_tokens=4)
    page.get_by_test_id("view-inside").click()
    page.wait_for_selector("[data-testid=logit-lens] tbody tr")
    assert page.input_value("#inside-prompt") == PROMPT  # analysed by default
    heatmap = page.get_by_test_id("attention")
    assert (heatmap.get_attribute("data-layer"), heatmap.get_attribute("data-head")) == ("0", "0")
    seen = {canvas_pixels(page, "attention")}
    page.get_by_test_id("head").select_option("1")
    assert heatmap.get_attribute("data-head") == "1"
    seen.add(canvas_pixels(page, "attention"))
    page.get_by_test_id("layer").select_option("1")
    assert heatmap.get_attribute("data-layer") == "1"
    seen.add(canvas_pixels(page, "attention"))
    assert len(seen) == 3  # three different pictures
    assert page.get_by_test_id("logit-lens").locator("tbody tr").count() == 3  # h_0, h_1, h_2

    # The number under the pointer is the endpoint's: layer 2, head 2, last query, first key.
    answer = call(site[0].url, "POST", "/v1/inspect", {"prompt": PROMPT}).json()
    T = len(answer["tokens"])
    box = heatmap.bounding_box()
    cell = (box["width"] - 34) / T
    page.mouse.move(box["x"] + 34 + cell / 2, box["y"] + 34 + (T - 0.5) * cell)
    readout = page.inner_text("#attention-readout")
    assert readout.endswith(f"A = {answer['attention']['weights'][1][1][T - 1][0]:.7f}")
    page.keyboard.press("Tab")
    page.get_by_test_id("attention").focus()
    page.keyboard.press("ArrowUp")
    assert f"query {T - 2} " in page.inner_text("#attention-readout")
    page.screenshot(path=str(shots / "page-inside.png"), full_page=True)


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
    for view in ("inside", "runs", "generate"):
        page.keyboard.press("ArrowRight")
        assert page.get_by_test_id(f"view-{view}").get_attribute("aria-selected") == "true"
        assert page.evaluate("document.activeElement.dataset.view") == view
        if view == "inside":
            page.wait_for_selector("[data-testid=logit-lens] tbody tr")
        overflow = page.evaluate("document.documentElement.scrollWidth")
        assert overflow <= 390, f"{view}: the page is {overflow} px wide on a 390 px screen"
        page.screenshot(path=str(shots / f"page-{view}-phone.png"), full_page=True)


def test_a_chat_model_gets_a_conversation_and_inside_reads_it(browser, runs, shots):
    """The chat run (its template) without an API key: two turns, then the inside view analyses
    the whole templated conversation, as /v1/inspect does with the same messages."""
    server = ServerProcess(runs[0])
    try:
        pg = browser.new_page(viewport={"width": 1280, "height": 800})
        errors: list[str] = []
        pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        pg.on("pageerror", lambda e: errors.append(str(e)))
        pg.set_default_timeout(WAIT_MS)
        pg.goto(server.url + "/")
        pg.wait_for_function("document.querySelector('#model-line').textContent.includes('chat')")
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
        pg.get_by_test_id("view-inside").click()
        pg.wait_for_selector("[data-testid=logit-lens] tbody tr")
        messages = [{"role": "user", "content": "abc"}, {"role": "assistant", "content": reply[0]},
                    {"role": "user", "content": "def"}]
        answer = call(server.url, "POST", "/v1/inspect", {"messages": messages}).json()
        columns = pg.get_by_test_id("logit-lens").locator("thead th").count() - 1
        assert columns == len(answer["tokens"])
        pg.screenshot(path=str(shots / "page-chat.png"), full_page=True)
        assert errors == []
    finally:
        assert server.stop(signal.SIGTERM) == 0


def test_a_server_with_an_api_key_serves_the_page_which_asks_for_the_key(browser, server):
    """The page's files are open; its API calls carry the key the user types (401 without)."""
    from serve_helpers import KEY
    assert call(server.url, "GET", "/").status == 200
    assert call(server.url, "GET", "/static/page.js").status == 200
    assert call(server.url, "GET", "/v1/inspect").status == 401
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    pg = context.new_page()
    pg.set_default_timeout(WAIT_MS)
    pg.goto(server.url + "/")
    pg.wait_for_function("document.querySelector('#model-line').textContent"
                         ".includes('API key')")
    pg.get_by_test_id("api-key").fill(KEY)
    pg.get_by_test_id("api-key").press("Enter")
    pg.wait_for_function("document.querySelector('#model-line').textContent.includes('layers')")
    assert pg.get_by_test_id("api-key").input_value() == KEY  # kept for the tab
    context.close()
