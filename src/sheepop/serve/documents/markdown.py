"""Markdown to HTML, for the maths pages the server shows (docs/page.md, "The mathematics,
rendered"), read the way GitHub reads it: markdown-it-py (CommonMark, with tables) and its
dollarmath plugin; each formula through sheepop.serve.documents.mathml.

What is ours, on top of the library's output: headings get GitHub's ids (so `page.md#a-heading`
lands) and a link to themselves; ```math is a displayed formula and ```example a worked example
(tests/docs run them); a link or a picture goes through `resolve`, and one it does not serve is
shown as its text, titled `outside(target)`, never a link to a 404; tables scroll in their own
box. No HTML passes through (markdown-it's `html` option is off): a page cannot inject markup.

`render(text, resolve, outside)` gives the page's HTML, its title and the TeX it could not draw.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from html import escape
from typing import NamedTuple

from markdown_it import MarkdownIt
from markdown_it.rules_core import StateCore
from markdown_it.token import Token
from mdit_py_plugins.dollarmath import dollarmath_plugin

from sheepop.serve.documents.mathml import to_mathml

Resolve = Callable[[str, bool], "str | None"]
"""(a link's or picture's target as written, is it a picture) -> the URL to use, or None when
the target is not served (the link is then shown as its text)."""

_SAFE_SCHEME = re.compile(r"(?:https?|mailto):", re.I)
_SCHEME = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*:")


class Page(NamedTuple):
    html: str                     # the body: one element after another
    title: str                    # the first heading's text ("" when there is none)
    unsupported: tuple[str, ...]  # TeX shown as its source, in order


def keep(target: str, image: bool) -> str | None:
    """The resolver that keeps every target as written (unsafe schemes aside)."""
    return target


def render(text: str, resolve: Resolve = keep, outside: Callable[[str], str] = str) -> Page:
    """The Markdown `text` as HTML; each link's and picture's target goes through `resolve`,
    and one it does not serve is shown as text, titled `outside(target)`."""
    env = {"resolve": resolve, "outside": outside, "unsupported": [], "title": None}
    html = _MARKDOWN.render(text, env)
    return Page(html.rstrip("\n"), env["title"] or "", tuple(env["unsupported"]))


def _math(env: dict, tex: str, display: bool) -> str:
    formula = to_mathml(tex.strip(), display)
    env["unsupported"].extend(formula.unsupported)
    return formula.markup


def _plain(tokens: list[Token]) -> str:
    """The text a reader sees in a heading's inline tokens (a formula as its source)."""
    return "".join(t.content for t in tokens if t.type in ("text", "code_inline", "math_inline"))


def _headings_and_links(state: StateCore) -> None:
    """GitHub's heading ids (lower case, punctuation dropped, spaces to hyphens, -1, -2 ...
    after a repeat), the first heading as the title, and each link's target resolved."""
    env, seen = state.env, {}
    for i, token in enumerate(state.tokens):
        if token.type == "heading_open":
            text = _plain(state.tokens[i + 1].children or []).strip()
            env["title"] = env["title"] if env["title"] is not None else text
            slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
            repeats = seen[slug] = seen.get(slug, -1) + 1
            slug = f"{slug}-{repeats}" if repeats else slug
            token.attrSet("id", slug)
            state.tokens[i + 2].meta["slug"] = slug
        for j, link in enumerate(token.children or []):
            if link.type == "link_open":
                _resolve_link(link, _closing(token.children, j), env)


def _closing(tokens: list[Token], opening: int) -> Token:
    depth = 0
    for token in tokens[opening:]:
        depth += token.nesting
        if depth == 0:
            return token
    raise AssertionError("markdown-it closes every link it opens")


def _served(target: str, image: bool, env: dict) -> str | None:
    if _SCHEME.match(target):
        return target if _SAFE_SCHEME.match(target) else None
    return env["resolve"](target, image)


def _resolve_link(opening: Token, closing: Token, env: dict) -> None:
    """A served link keeps its <a>; another is a <span class="outside"> titled with where it
    points."""
    target = str(opening.attrGet("href"))
    url = _served(target, False, env)
    if url is not None:
        opening.attrSet("href", url)
        return
    opening.tag = closing.tag = "span"
    opening.attrs = {"class": "outside", "title": env["outside"](target)}


def _heading_close(self, tokens: list[Token], i: int, options, env: dict) -> str:
    slug = escape(tokens[i].meta["slug"])
    return (f' <a class="anchor" href="#{slug}" aria-label="link to this section">#</a>'
            f"</{tokens[i].tag}>\n")


def _image(self, tokens: list[Token], i: int, options, env: dict) -> str:
    token = tokens[i]
    target, alt = str(token.attrGet("src")), escape(self.renderInlineAsText(token.children,
                                                                            options, env))
    url = _served(target, True, env)
    if url is None:
        where = escape(env["outside"](target))
        return f'<span class="missing-image" title="{where}">[{alt}]</span>'
    title = f' title="{escape(str(token.attrGet("title")))}"' if token.attrGet("title") else ""
    return f'<img src="{escape(url)}" alt="{alt}"{title} loading="lazy">'


def _fence(self, tokens: list[Token], i: int, options, env: dict) -> str:
    """```math: a displayed formula; ```example NAME: a worked example the tests run."""
    info, source = tokens[i].info.split(), tokens[i].content.rstrip("\n")
    if info[:1] == ["math"]:
        return f'<div class="math-display">{_math(env, source, True)}</div>\n'
    if info[:1] == ["example"]:
        name = escape(info[1] if len(info) > 1 else "")
        return (f'<figure class="example"><figcaption>worked example <code>{name}</code>, '
                f"checked by the tests</figcaption><pre><code>{escape(source)}</code></pre>"
                "</figure>\n")
    return self.fence(tokens, i, options, env)


def _math_inline(self, tokens: list[Token], i: int, options, env: dict) -> str:
    """$x$, or GitHub's $`x`$."""
    tex = tokens[i].content
    return _math(env, tex[1:-1] if len(tex) > 1 and tex[0] == tex[-1] == "`" else tex, False)


def _math_inline_double(self, tokens: list[Token], i: int, options, env: dict) -> str:
    return f'<span class="math-display">{_math(env, tokens[i].content, True)}</span>'


def _math_block(self, tokens: list[Token], i: int, options, env: dict) -> str:
    return f'<div class="math-display">{_math(env, tokens[i].content, True)}</div>\n'


def _table(self, tokens: list[Token], i: int, options, env: dict) -> str:
    """A table scrolls sideways in its own box (a phone's screen is narrower)."""
    if tokens[i].nesting == 1:
        return '<div class="table-scroll">' + self.renderToken(tokens, i, options, env)
    return self.renderToken(tokens, i, options, env).rstrip("\n") + "</div>\n"


def _markdown() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    md.use(dollarmath_plugin, allow_space=False, allow_digits=False, double_inline=True)
    md.validateLink = lambda url: True  # (every target is judged by _served instead)
    md.core.ruler.push("headings_and_links", _headings_and_links)
    for name, rule in (("heading_close", _heading_close), ("image", _image), ("fence", _fence),
                       ("math_inline", _math_inline), ("math_inline_double", _math_inline_double),
                       ("math_block", _math_block), ("table_open", _table),
                       ("table_close", _table)):
        md.add_render_rule(name, rule)
    return md


_MARKDOWN = _markdown()
