"""Markdown to HTML (sheepop.serve.documents.markdown: markdown-it-py and our rules) with exact
output for each block and span the docs use; the maths pages served at /docs/
(sheepop.serve.documents.routes): every link between them lands on a page and a heading that
exist, nothing links to a 404. (The built package's copy: test_documents_wheel.py.)"""

import asyncio
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse

from sheepop.serve.api.protocol import ApiError
from sheepop.serve.documents import routes, shown
from sheepop.serve.documents.markdown import render
from sheepop.serve.page.routes import STATIC

DOCS = Path(__file__).resolve().parents[2] / "docs"


def resolve(target: str, image: bool) -> str | None:
    """A test resolver: one page and one picture are served, nothing else."""
    if target.startswith("05-feed-forward.md"):
        return "/docs/math/" + target
    return "/docs/images/a.png" if target == "../images/a.png" else None


def html(text: str) -> str:
    return render(text, resolve, lambda target: "repo:" + target).html


def anchor(slug: str) -> str:
    return f' <a class="anchor" href="#{slug}" aria-label="link to this section">#</a>'


def test_headings_get_githubs_ids_and_the_first_is_the_title():
    page = render("# Title `x`\n\n## 4.3 Scaled *scores*, and why `1/sqrt(d_k)`\n\n"
                  "## Title x\n\n### Title x\n")
    assert page.title == "Title x"
    assert page.html.split("\n") == [
        f'<h1 id="title-x">Title <code>x</code>{anchor("title-x")}</h1>',
        '<h2 id="43-scaled-scores-and-why-1sqrtd_k">4.3 Scaled <em>scores</em>, and why '
        f'<code>1/sqrt(d_k)</code>{anchor("43-scaled-scores-and-why-1sqrtd_k")}</h2>',
        f'<h2 id="title-x-1">Title x{anchor("title-x-1")}</h2>',
        f'<h3 id="title-x-2">Title x{anchor("title-x-2")}</h3>']


def test_a_paragraph_with_emphasis_code_and_escapes():
    assert html("Some *em* and **strong** text with `a < b` code,\nand a_b_c * 3 * 4.\n"
                "Escaped \\*star\\* and <b>tag</b> & more.  \nNext line") == (
        "<p>Some <em>em</em> and <strong>strong</strong> text with <code>a &lt; b</code> code,\n"
        "and a_b_c * 3 * 4.\nEscaped *star* and &lt;b&gt;tag&lt;/b&gt; &amp; more.<br />\n"
        "Next line</p>")


def test_fences_formulas_examples_and_code():
    assert html("```math\nx^2\n```\n\n```example layernorm\nx = [1]\n```\n\n```sh\necho <hi>"
                "\n```\n\n    indented\n    code\n").split("\n") == [
        '<div class="math-display"><math display="block"><semantics><mrow><msup><mi>x</mi>'
        '<mn>2</mn></msup></mrow><annotation encoding="application/x-tex">x^2</annotation>'
        "</semantics></math></div>",
        '<figure class="example"><figcaption>worked example <code>layernorm</code>, checked by '
        "the tests</figcaption><pre><code>x = [1]</code></pre></figure>",
        '<pre><code class="language-sh">echo &lt;hi&gt;', "</code></pre>",
        "<pre><code>indented", "code", "</code></pre>"]


def test_inline_and_display_formulas_and_dollars_that_are_not():
    out = html("Inline $a_1$ and $`b^2`$, not $5 or $ 6$.\n\n$$\n\\sum_i x_i\n$$\n")
    assert out == (
        "<p>Inline <math><semantics><mrow><msub><mi>a</mi><mn>1</mn></msub></mrow><annotation "
        'encoding="application/x-tex">a_1</annotation></semantics></math> and <math><semantics>'
        '<mrow><msup><mi>b</mi><mn>2</mn></msup></mrow><annotation encoding="application/x-tex">'
        "b^2</annotation></semantics></math>, not $5 or $ 6$.</p>\n"
        '<div class="math-display"><math display="block"><semantics><mrow><munder>'
        "<mo>\u2211</mo><mi>i</mi></munder><msub><mi>x</mi><mi>i</mi></msub></mrow>"
        '<annotation encoding="application/x-tex">\\sum_i x_i</annotation></semantics></math>'
        "</div>")


def test_lists_tight_nested_loose_and_numbered_from_three():
    assert html("- one\n- two\n  continued\n  - nested\n- three\n\n"
                "3. three\n4. four\n\n   second paragraph\n").split("\n") == [
        "<ul>", "<li>one</li>", "<li>two", "continued", "<ul>", "<li>nested</li>", "</ul>",
        "</li>", "<li>three</li>", "</ul>",
        '<ol start="3">', "<li>", "<p>three</p>", "</li>", "<li>", "<p>four</p>",
        "<p>second paragraph</p>", "</li>", "</ol>"]


def test_a_table_with_alignment_and_an_escaped_bar_inside_code():
    """(GitHub splits a row at every bar not escaped, inside code too: `x\\|y` is x|y.)"""
    left, center, right = (f' style="text-align:{side}"' for side in ("left", "center", "right"))
    assert html("| a | b `x\\|y` | c |\n|:--|:-:|--:|\n| 1 | 2 | 3 |\n| only |\n").split("\n") == [
        '<div class="table-scroll"><table>', "<thead>", "<tr>", f"<th{left}>a</th>",
        f"<th{center}>b <code>x|y</code></th>", f"<th{right}>c</th>", "</tr>", "</thead>",
        "<tbody>", "<tr>", f"<td{left}>1</td>", f"<td{center}>2</td>", f"<td{right}>3</td>",
        "</tr>", "<tr>", f"<td{left}>only</td>", f"<td{center}></td>", f"<td{right}></td>",
        "</tr>", "</tbody>", "</table></div>"]


def test_links_served_or_shown_as_text_and_pictures():
    assert html("[served](05-feed-forward.md#top) [outside](../../src/x.py) "
                "![pic](../images/a.png) ![gone](nope.png) [web](https://example.org/a) "
                "[bad](javascript:alert(1)) <https://x.org>") == (
        '<p><a href="/docs/math/05-feed-forward.md#top">served</a> '
        '<span class="outside" title="repo:../../src/x.py">outside</span> '
        '<img src="/docs/images/a.png" alt="pic" loading="lazy"> '
        '<span class="missing-image" title="repo:nope.png">[gone]</span> '
        '<a href="https://example.org/a">web</a> '
        '<span class="outside" title="repo:javascript:alert(1)">bad</span> '
        '<a href="https://x.org">https://x.org</a></p>')


def test_quotes_rules_and_no_markup_from_the_source():
    assert html("> quoted *text*\n> more\n\n---\n\n<script>x</script> [a](<b>)") == (
        "<blockquote>\n<p>quoted <em>text</em>\nmore</p>\n</blockquote>\n<hr />\n"
        '<p>&lt;script&gt;x&lt;/script&gt; <span class="outside" title="repo:b">a</span></p>')
    hostile = html('[x" onmouseover="y](05-feed-forward.md" onclick="z) `</code><b>` '
                   '$\\text{</math><img src=x>}$ [y](05-feed-forward.md"onclick="z)')
    tags = Tags()
    tags.feed(hostile)
    assert tags.seen == [("p", []), ("code", []), ("math", []), ("semantics", []),
                         ("mrow", []), ("mtext", []), ("annotation", ["encoding"]),
                         ("a", ["href"])]


class Tags(HTMLParser):
    """The elements of a piece of HTML, with their attributes' names."""

    def __init__(self):
        super().__init__()
        self.seen: list[tuple[str, list[str]]] = []

    def handle_starttag(self, tag, attrs):
        self.seen.append((tag, [name for name, _ in attrs]))


# ----- the pages served at /docs/ ---------------------------------------------------------------

SHOWN = shown.pages(DOCS)


@pytest.fixture(scope="module")
def served() -> dict[str, str]:
    return {p: routes.html_page(DOCS, p) for p in SHOWN}


@pytest.mark.parametrize("page", SHOWN)
def test_every_link_of_a_served_page_lands_on_a_page_and_a_heading_that_exist(page, served):
    ids = {p: set(re.findall(r' id="([^"]+)"', html)) for p, html in served.items()}
    served = served[page]
    hrefs = re.findall(r'<a href="([^"]*)"', served) + re.findall(r'<img src="([^"]*)"', served)
    assert hrefs
    for href in hrefs:
        path, _, fragment = href.partition("#")
        if href.startswith(("https://", "http://")) or path == "/":
            continue
        if not path:
            assert fragment in ids[page], f"{page}: {href}"
            continue
        assert path.startswith("/docs/"), f"{page}: {href}"
        assert path[6:] in shown.files(DOCS), f"{page}: {href} is not served"
        if fragment:
            assert fragment in ids[path[6:]], f"{page}: no heading #{fragment} in {path}"
    prose = re.sub(r"<code>.*?</code>", "", served, flags=re.S)
    assert "$$" not in prose and "```" not in prose


def test_every_link_of_the_page_to_the_maths_lands(served):
    """The page's views (static/*.js, index.html) name pages of docs/math, some with a heading's
    anchor: each is served and each anchor is a heading there."""
    static = STATIC
    named = {m for f in sorted(static.glob("*.*")) if f.suffix in (".js", ".html")
             for m in re.findall(r"\b((?:[0-9]{2}-[a-z0-9-]+|index)\.md(?:#[\w-]+)?)",
                                 f.read_text(encoding="utf-8"))}
    assert "04-attention.md" in named
    for target in sorted(named):
        page, _, fragment = target.partition("#")
        assert f"math/{page}" in served, target
        assert not fragment or f' id="{fragment}"' in served[f"math/{page}"], target


def get(path: str) -> tuple[int, dict[str, str], bytes]:
    """GET `path` from the documents' routes, in process."""
    async def on_error(request, e: ApiError) -> JSONResponse:
        return JSONResponse(e.body(), e.status)

    app = Starlette(routes=routes.ROUTES, exception_handlers={ApiError: on_error})
    sent: list[dict] = []
    scope = {"type": "http", "method": "GET", "path": path, "raw_path": path.encode(),
             "query_string": b"", "headers": [(b"host", b"127.0.0.1")], "http_version": "1.1",
             "scheme": "http", "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 9),
             "root_path": ""}

    async def exchange() -> None:
        """The request once; then the client stays until the response ends (a FileResponse
        listens for its disconnection meanwhile)."""
        answered, asked = asyncio.Event(), []

        async def receive():
            if not asked:
                asked.append(True)
                return {"type": "http.request", "body": b"", "more_body": False}
            await answered.wait()
            return {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                answered.set()

        await asyncio.wait_for(app(scope, receive, send), 30)

    asyncio.run(exchange())
    headers = {k.decode(): v.decode() for k, v in sent[0]["headers"]}
    return sent[0]["status"], headers, b"".join(m.get("body", b"") for m in sent[1:])


def test_the_routes_serve_pages_pictures_and_nothing_else():
    status, headers, body = get("/docs/math/04-attention.md")
    assert status == 200 and headers["content-type"].startswith("text/html")
    text = body.decode()
    assert "<title>4. Multi-head causal self-attention · sheepop</title>" in text
    assert '<link rel="stylesheet" href="/static/page.css">' in text and "<math" in text
    assert get("/docs/math/")[:2] == (308, {**get("/docs/math/")[1],
                                           "location": "/docs/math/index.md"})
    status, headers, body = get("/docs/images/attention.png")
    assert (status, headers["content-type"]) == (200, "image/png") and body[:4] == b"\x89PNG"
    for path in ("/docs/math/nothing.md", "/docs/math/../../README.md", "/docs/cli.md",
                 "/docs/images/page-generate.png", "/docs/math/04-attention", "/docs/"):
        assert get(path)[0] == 404, path
