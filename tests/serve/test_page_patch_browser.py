"""The page's Patching view (docs/page.md, docs/experiments.md) in headless Chromium, on the
plain run (2 blocks, 2 heads, one character a token) served by the NumPy engine: the form asks
POST /v1/patch, the grids hold one cell per block and position (or head), the cell under the
pointer reads the numbers of the JSON the page received, the last block's last position reads
1.000 in the clean run's colour, the agreement is Pearson's r of the two grids, and a pair of
prompts of unequal lengths shows the server's 400 message."""

import re

import numpy as np
import pytest
from chromium import needs_chromium, opened
from serve_helpers import call

pytestmark = needs_chromium
CLEAN, CORRUPTED = "abc def", "abd deg"  # 7 tokens each; position 2 is the first that differs
READ = re.compile(r"exact score (\S+) \(m = (\S+)\); estimated score (\S+) \(m ≈ (\S+)\)")


@pytest.fixture
def page(browser, plain_server):
    with opened(browser, plain_server.url + "/#patch") as pg:
        yield pg


def patch(pg, kind="positions", clean=CLEAN, corrupted=CORRUPTED) -> dict:
    """Fill the form, press Patch; the JSON the page received from /v1/patch."""
    pg.fill("#patch-clean", clean)
    pg.fill("#patch-corrupted", corrupted)
    pg.fill("#patch-answer", "h")
    pg.fill("#patch-wrong", "a")
    pg.select_option("#patch-kind", kind)
    with pg.expect_response("**/v1/patch") as reply:
        pg.get_by_test_id("patch-run").click()
    return reply.value.json()


def read_cell(pg, testid: str, row: int, col: int) -> tuple[float, ...]:
    pg.hover(f"[data-testid={testid}] td[data-row='{row}'][data-col='{col}']")
    text = pg.inner_text("[data-testid=patch-readout]")
    return tuple(float(v.replace("−", "-")) for v in READ.search(text).groups())


def test_the_grid_is_the_endpoints_cell_by_cell(page, plain_server, shots):
    got = patch(page)
    page.wait_for_selector("[data-testid=patch-exact] td")
    assert got["layers"] == [0, 1] and len(got["clean"]) == 7
    for testid in ("patch-exact", "patch-estimated"):
        assert page.locator(f"[data-testid={testid}] td").count() == 2 * 7  # blocks x positions
    exact, estimate = np.array(got["scores"]), np.array(got["attribution"]["scores"])
    for row, col in ((1, 6), (0, 3), (1, 2), (0, 0)):
        for testid in ("patch-exact", "patch-estimated"):  # either grid reads both numbers
            assert read_cell(page, testid, row, col) == (
                exact[row, col], got["metric"][row][col],
                estimate[row, col], got["attribution"]["metric"][row][col])
    last = page.locator("[data-testid=patch-exact] td[data-row='1'][data-col='6']")
    assert last.inner_text() == "1.000" and exact[1, 6] == 1.0  # the clean run itself
    assert last.evaluate("td => getComputedStyle(td).backgroundColor") == "rgb(255, 0, 0)"
    first = page.locator("[data-testid=patch-exact] td[data-row='0'][data-col='0']")
    assert exact[0, 0] == 0.0 and first.inner_text() == "0.000"  # before the change: nothing
    assert first.evaluate("td => getComputedStyle(td).backgroundColor") == "rgb(255, 255, 255)"
    r = float(page.get_attribute("[data-testid=patch-agreement]", "data-r"))
    assert r == pytest.approx(np.corrcoef(exact.ravel(), estimate.ravel())[0, 1], abs=1e-12)
    assert f"r = {r:.4f}" in page.inner_text("[data-testid=patch-agreement]")
    metric = page.locator("[data-testid=patch-metric]")
    assert (metric.get_attribute("data-clean"), metric.get_attribute("data-corrupted")) == (
        str(got["clean_metric"]), str(got["corrupted_metric"]))
    assert (f"m_c = {got['clean_metric']:.4f} (clean), m* = {got['corrupted_metric']:.4f}"
            in metric.inner_text())
    # The same numbers from the keyboard: the grid's first arrow press reads its last cell.
    page.focus("[data-testid=patch-exact]")
    page.keyboard.press("ArrowDown")
    assert page.get_attribute("[data-testid=patch-readout]", "data-layer") == "1"
    assert page.get_attribute("[data-testid=patch-readout]", "data-column") == "6"
    page.screenshot(path=str(shots / "page-patch.png"), full_page=True)


def test_the_heads_grid_and_a_phone(page, shots):
    got = patch(page, kind="heads")
    page.wait_for_selector("[data-testid=patch-exact] td")
    assert np.array(got["scores"]).shape == (2, 2)
    assert page.locator("[data-testid=patch-exact] td").count() == 2 * 2  # blocks x heads
    assert page.locator("[data-testid=patch-exact] thead th").all_inner_texts()[1:] == [
        "head 0", "head 1"]
    assert read_cell(page, "patch-exact", 1, 0)[0] == got["scores"][1][0]
    page.fill("#patch-position", "6")  # each head at the last position alone, block 1 only
    page.fill("#patch-blocks", "1")
    got = patch(page, kind="heads")
    assert got["position"] == 6 and got["layers"] == [1]
    page.wait_for_selector("[data-testid=patch-exact] td[data-row='0']")
    assert page.locator("[data-testid=patch-exact] td").count() == 2
    assert read_cell(page, "patch-exact", 0, 1)[0] == got["scores"][0][1]
    assert page.inner_text("[data-testid=patch-readout]").startswith(
        "block 1, head 1 at position 6;")
    sent: list[str] = []
    page.on("request", lambda r: sent.append(r.url) if "/v1/patch" in r.url else None)
    page.fill("#patch-blocks", "0-2")  # past the last block: said on the page, nothing asked
    page.get_by_test_id("patch-run").click()
    assert page.inner_text("[data-testid=patch-status]").startswith("Blocks: give indices 0 to 1")
    assert sent == []
    page.fill("#patch-blocks", "")
    page.fill("#patch-position", "")
    page.set_viewport_size({"width": 390, "height": 844})
    patch(page)
    page.wait_for_selector("[data-testid=patch-exact] td[data-col='6']")
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    page.screenshot(path=str(shots / "page-patch-phone.png"), full_page=True)


def read_bar(pg, k: int) -> float:
    canvas = pg.get_by_test_id("shares")
    canvas.scroll_into_view_if_needed()
    box, left, bar = (canvas.bounding_box(), float(canvas.get_attribute("data-left")),
                      float(canvas.get_attribute("data-bar")))
    pg.mouse.move(box["x"] + left + (k + 0.5) * bar, box["y"] + box["height"] / 2)
    assert pg.get_attribute("[data-testid=shares-readout]", "data-bar") == str(k)
    text = pg.inner_text("[data-testid=shares-readout]")
    return float(re.search(r": share (\S+) of m", text).group(1))


def test_the_direct_logit_attribution_is_a_bar_per_part(page, shots):
    """One bar per part (the embedding; 2 heads, the attention's b_proj and the feed-forward
    per block; LayerNorm's beta), each reading the JSON's share on either prompt, summing to
    m."""
    got = patch(page)
    shares = got["logit_attribution"]
    assert shares["names"] == ["embed", *(f"blocks.{i}.{p}" for i in (0, 1) for p in (
        "attn.head.0", "attn.head.1", "attn.bias", "ffn")), "final_norm.bias"]
    page.wait_for_selector("[data-testid=shares]")
    assert page.get_attribute("[data-testid=shares]", "data-bars") == "10"
    for prompt in ("clean", "corrupted"):
        page.select_option("[data-testid=shares-prompt]", prompt)
        assert [read_bar(page, k) for k in range(10)] == shares[prompt]["shares"]
        total = float(page.get_attribute("[data-testid=shares-summary]", "data-sum"))
        assert total == pytest.approx(got[f"{prompt}_metric"], abs=1e-5)  # (float32 pass)
        assert f"m = {got[f'{prompt}_metric']:.4f}" in page.inner_text(
            "[data-testid=shares-summary]")
    read_bar(page, 5)
    assert page.inner_text("[data-testid=shares-readout]") == (
        f"head 1.0: share {shares['corrupted']['shares'][5]} of m (corrupted prompt)")
    page.focus("[data-testid=shares]")
    page.keyboard.press("End")
    assert page.get_attribute("[data-testid=shares-readout]", "data-bar") == "9"
    assert page.inner_text("[data-testid=shares-readout]").startswith("the final norm's β")
    page.screenshot(path=str(shots / "page-patch-shares.png"), full_page=True)


def test_prompts_of_unequal_lengths_show_the_servers_400(page, plain_server):
    body = {"clean": CLEAN, "corrupted": "abd de", "answer": "h", "wrong": "a"}
    reply = call(plain_server.url, "POST", "/v1/patch", body)
    assert reply.status == 400 and reply.json()["error"]["param"] == "corrupted"
    patch(page, corrupted="abd de")
    status = page.get_by_test_id("patch-status")
    page.wait_for_function("document.querySelector('[data-testid=patch-status]')"
                           ".classList.contains('error')")
    assert status.inner_text() == reply.json()["error"]["message"]
    assert "7" in status.inner_text() and "6" in status.inner_text()  # the two lengths
    assert page.locator("[data-testid=patch-exact] td").count() == 0
    page.expected_errors.append("Failed to load resource: the server responded with a status "
                                "of 400 (Bad Request)")
