"""The maths pages that `sheepop serve` renders at /docs/ (docs/page.md, "The mathematics,
rendered"), in a real headless Chromium (Debian's, through Playwright, as
tests/serve/test_page_browser.py): the formulas are laid out as MathML (a fraction's numerator
above its denominator, nothing of zero size), no TeX source is left to read, every link between
the pages opens (200) on a heading that exists, the page's own links open them, the console
stays clean, and at 390x844 the body never scrolls sideways (a long formula scrolls in its own
box). The server has an API key: the documents need none (the page itself is opened on the one
without). Screenshots go to $SHEEPOP_PAGE_SHOTS
(default: a temporary folder)."""

import re
from pathlib import Path

import pytest
from chromium import needs_chromium, opened

from sheepop.serve.documents import shown

pytestmark = needs_chromium
PAGES = shown.pages(shown.root())


@pytest.fixture
def page(browser):
    """A fresh page at 1280x800 (each test opens its own address); at the end, no error in its
    console."""
    with opened(browser) as pg:
        yield pg


FORMULA_BOXES = """() => [...document.querySelectorAll('math')].map(m => {
    const r = m.getBoundingClientRect();
    return {tex: m.querySelector('annotation').textContent, width: r.width, height: r.height,
            display: getComputedStyle(m).display}; })"""

FRACTIONS = """() => [...document.querySelectorAll('mfrac')].map(f => {
    const [top, bottom] = [...f.children].map(c => c.getBoundingClientRect());
    return [top.bottom, bottom.top, top.height, bottom.height]; })"""


def test_the_formulas_are_laid_out_as_mathml(page, server, shots):
    page.goto(server.url + "/docs/math/08-loss.md")
    assert page.title() == "8. Cross-entropy, padding, perplexity, bits per byte · sheepop"
    boxes = page.evaluate(FORMULA_BOXES)
    assert len(boxes) == 6  # the six formulas of the page
    assert all(b["width"] > 10 and b["height"] > 10 for b in boxes), boxes
    assert {b["display"] for b in boxes} <= {"block math", "inline math", "math"}
    softmax = [b for b in boxes if b["tex"].startswith("p_t[v] = \\frac{e^{z_t[v]}}")]
    assert len(softmax) == 1 and softmax[0]["height"] > 40  # a fraction: two lines tall
    for top_bottom, bottom_top, top_h, bottom_h in page.evaluate(FRACTIONS):
        assert top_bottom <= bottom_top + 1 and top_h > 0 and bottom_h > 0  # one above the other
    shown = page.inner_text("body")
    for source in ("$$", "\\frac", "\\sum", "```", "\\text"):
        assert source not in shown
    assert page.locator(".tex-unsupported").count() == 0
    page.goto(server.url + "/docs/math/06-layernorm.md")
    page.screenshot(path=str(shots / "page-math.png"))  # docs/page.md shows it


def test_every_page_opens_and_every_link_between_them_lands(page, server):
    """Each page shown at /docs/ in the browser: no TeX source visible, no unsupported command;
    each of its links to /docs/ answers 200 and, with an anchor, lands on a heading there."""
    status: dict[str, int] = {}
    ids: dict[str, set[str]] = {}
    for name in PAGES:
        page.goto(f"{server.url}/docs/{name}")
        shown = page.inner_text("main")
        assert "$$" not in shown and "\\frac" not in shown, name
        assert page.locator(".tex-unsupported").count() == 0, name
        hrefs = page.eval_on_selector_all("main a[href], main img", "ns => ns.map(n => "
                                          "n.getAttribute('href') || n.getAttribute('src'))")
        for href in hrefs:
            path, _, fragment = href.partition("#")
            if not path:
                path = f"/docs/{name}"
            if not path.startswith("/"):
                assert path.startswith("https://"), f"{name}: {href}"
                continue  # (a page on the web: not fetched, the tests run offline)
            if path not in status:
                answer = page.request.get(server.url + path)
                status[path] = answer.status
                if answer.headers["content-type"].startswith("text/html"):
                    ids[path] = set(re.findall(r' id="([^"]+)"', answer.text()))
            assert status[path] == 200, f"{name}: {href}"
            assert not fragment or fragment in ids[path], f"{name}: {href}: no such heading"
    assert {f"/docs/{p}" for p in PAGES if p.startswith("math/")} <= set(status)


def test_the_pages_views_open_the_rendered_pages(page, plain_server):
    """(On the server without a key: the page itself calls the API as soon as it opens.)"""
    server = plain_server
    page.goto(server.url + "/")
    links = page.eval_on_selector_all("a.doc", "ns => ns.map(n => n.getAttribute('href'))")
    assert len(links) >= 5 and all(href.startswith(("/docs/math/", "/docs/experiments.md"))
                                   for href in links)  # (experiments.md: the Patching view's)
    for href in set(links):
        answer = page.request.get(server.url + href)
        assert answer.status == 200 and answer.headers["content-type"].startswith("text/html")
        assert '<main class="doc-page">' in answer.text(), href
    first = page.locator("a.doc:visible").first
    href = first.get_attribute("href")
    first.click()
    page.wait_for_selector("main.doc-page h1")
    assert page.url == server.url + href
    page.get_by_role("link", name="the mathematics").click()
    page.wait_for_selector("main.doc-page h1")
    assert page.inner_text("main h1").startswith("The mathematics of sheepop")
    assert page.url == server.url + "/docs/math/index.md"


@pytest.mark.parametrize("name", ["math/03-positions.md", "math/07-transformer.md",
                                  "math/04-attention.md"])
def test_a_phone_scrolls_long_formulas_in_their_own_box(page, server, shots, name):
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(f"{server.url}/docs/{name}")
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, f"{name}: the page is {width} px wide on a 390 px screen"
    boxes = page.evaluate("""() => [...document.querySelectorAll('.math-display')].map(
        d => [d.scrollWidth, d.clientWidth, d.getBoundingClientRect().right])""")
    assert all(right <= 390 for _, _, right in boxes)
    assert any(scroll > client for scroll, client, _ in boxes)  # at least one scrolls inside
    page.screenshot(path=str(shots / f"page-math-phone-{Path(name).stem}.png"), full_page=True)
