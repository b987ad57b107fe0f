"""The page's Steering control (docs/steering.md, docs/page.md), in headless Chromium: on a
server started with --steer it lists the vector, and a greedy generation steered from the page
is the API's steered answer (and not the plain one); "none" sends no steering. A server
without vectors lists none in GET /v1/inspect (the control stays hidden)."""

import pytest
from chromium import needs_chromium, opened
from serve_helpers import ServerProcess, call

from sheepop.inference.load import load
from sheepop.inference.steer import make_vector

pytestmark = needs_chromium
PROMPT = "abc abc"


@pytest.fixture(scope="module")
def site(runs, tmp_path_factory):
    path = tmp_path_factory.mktemp("page-steer") / "ab.safetensors"
    model = load(runs[1], engine="numpy")
    make_vector(model, "plain", ["abab abab", "aaa bbb"], ["hij hij"], 1).save(path)
    with ServerProcess(runs[1], "--engine", "numpy", "--steer", str(path)) as s:
        yield s


@pytest.fixture
def page(browser, site):
    with opened(browser, site.url + "/") as pg:
        yield pg


def api_text(site, **body) -> str:
    reply = call(site.url, "POST", "/v1/completions",
                 {"prompt": PROMPT, "max_tokens": 16, "temperature": 0, **body})
    assert reply.status == 200
    return PROMPT + reply.json()["choices"][0]["text"]


def generate(pg, vector: str, strength: str) -> str:
    pg.get_by_test_id("prompt").fill(PROMPT)
    pg.fill("#max-tokens", "16")
    pg.fill("#temperature", "0")
    pg.select_option("#steer-vector", vector)
    pg.fill("#steer-strength", strength)
    pg.evaluate("document.querySelector('#generate-status').textContent = ''")
    pg.get_by_test_id("generate").click()
    pg.wait_for_function("document.querySelector('#generate-status').textContent"
                         ".includes('tokens in')")
    return pg.inner_text("#answer")


def test_the_page_steers_as_the_api_does(page, site):
    assert page.is_visible("#steering-controls")
    options = page.eval_on_selector_all("#steer-vector option", "o => o.map(x => x.textContent)")
    assert options == ["none", "ab (block 1)"]
    plain, steered = api_text(site), api_text(site, steering={"ab": 4})
    assert steered != plain
    assert generate(page, "ab", "4") == steered
    assert generate(page, "", "4") == plain  # "none": no steering sent


def test_a_server_without_vectors_lists_none(plain_server):
    """(The same run served without --steer: the session's plain server.)"""
    assert call(plain_server.url, "GET", "/v1/inspect").json()["steering"] == []
