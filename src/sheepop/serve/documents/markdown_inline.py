"""The inline part of sheepop.serve.documents.markdown: code spans, formulas, links, images, emphasis,
escapes and line breaks inside one paragraph, heading or table cell.

The spans that must not be read further (code, formulas, links, escapes) are found left to
right by one pattern and held aside as finished HTML; the rest is escaped, emphasis is read on
it, and the held pieces are put back. So nothing in the text can become markup.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from html import escape

from sheepop.serve.documents.mathml import to_mathml

Resolve = Callable[[str, bool], "str | None"]
"""(a link's or picture's target as written, is it a picture) -> the URL to use, or None when
the target is not served (the link is then shown as its text)."""

_SPAN = re.compile(r"""
    (?P<code>(?P<ticks>`+)(?P<code_text>.+?)(?<!`)(?P=ticks)(?!`))
  | \$`(?P<gh_math>[^`]+)`\$
  | \$\$(?P<display>.+?)\$\$
  | \$(?P<math>[^\s$](?:[^$\\]|\\.)*?)(?<![\s\\])\$(?!\d)
  | (?P<image>!)?\[(?P<label>(?:[^\[\]`]|`[^`]*`|\[[^\[\]]*\])*)\]
      \((?P<target>[^\s()]*(?:\([^\s()]*\)[^\s()]*)*)(?:\s+"(?P<title>[^"]*)")?\)
  | <(?P<autolink>https?://[^\s<>]+)>
  | (?P<break>(?:\ {2,}|\\)\n)
  | \\(?P<escaped>[!-/:-@\[-`{-~])
""", re.S | re.X)
_HELD = re.compile("\ue000([0-9]+)\ue001")
_EMPHASIS = [
    (re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*", re.S), "strong"),
    (re.compile(r"(?<!\w)__(?=\S)(.+?)(?<=\S)__(?!\w)", re.S), "strong"),
    (re.compile(r"(?<![\w*])\*(?=[^\s*])(.+?)(?<=[^\s*])\*(?![\w*])", re.S), "em"),
    (re.compile(r"(?<![\w_])_(?=[^\s_])(.+?)(?<=[^\s_])_(?![\w_])", re.S), "em"),
]
_SAFE_SCHEME = re.compile(r"(?:https?|mailto):", re.I)


@dataclass
class Context:
    """What one page's rendering shares: how targets resolve, the TeX commands shown as their
    source, the heading ids given so far."""
    resolve: Resolve
    outside: Callable[[str], str] = str  # how a target that is not served is named
    unsupported: list[str] = field(default_factory=list)
    ids: dict[str, int] = field(default_factory=dict)

    def math(self, tex: str, display: bool) -> str:
        formula = to_mathml(tex.strip(), display)
        self.unsupported.extend(formula.unsupported)
        return formula.markup


def keep(target: str, image: bool) -> str | None:
    """The resolver that keeps every target as written (web links and unsafe schemes aside)."""
    return target


def inline(text: str, ctx: Context) -> str:
    """`text` (one paragraph's source) as HTML."""
    held: list[str] = []

    def hold(html: str) -> str:
        held.append(html)
        return f"\ue000{len(held) - 1}\ue001"

    def span(m: re.Match) -> str:
        return hold(_span(m, ctx))

    text = _SPAN.sub(span, text.replace("\ue000", "").replace("\ue001", ""))
    html = escape(text, quote=False)
    for pattern, tag in _EMPHASIS:
        html = pattern.sub(lambda m, tag=tag: f"<{tag}>{m.group(1)}</{tag}>", html)
    return _HELD.sub(lambda m: held[int(m.group(1))], html)  # (held pieces hold none)


def plain(html: str) -> str:
    """The text a reader sees in `html`: tags and formulas' sources dropped."""
    html = re.sub(r"<annotation\b.*?</annotation>", "", html, flags=re.S)
    text = re.sub(r"<[^>]*>", "", html)
    return re.sub(r"&(amp|lt|gt|quot|#x27);",
                  lambda m: {"amp": "&", "lt": "<", "gt": ">", "quot": '"', "#x27": "'"}[
                      m.group(1)], text)


def _span(m: re.Match, ctx: Context) -> str:
    if m.group("code") is not None:
        code = m.group("code_text").replace("\n", " ")
        if code.startswith(" ") and code.endswith(" ") and code.strip():
            code = code[1:-1]
        return f"<code>{escape(code)}</code>"
    if m.group("gh_math") is not None:
        return ctx.math(m.group("gh_math"), display=False)
    if m.group("display") is not None:
        return f'<span class="math-display">{ctx.math(m.group("display"), True)}</span>'
    if m.group("math") is not None:
        return ctx.math(m.group("math"), display=False)
    if m.group("autolink") is not None:
        url = escape(m.group("autolink"))
        return f'<a href="{url}">{url}</a>'
    if m.group("break") is not None:
        return "<br>\n"
    if m.group("escaped") is not None:
        return escape(m.group("escaped"))
    return _link(m, ctx)


def _link(m: re.Match, ctx: Context) -> str:
    """A link or a picture. A target the resolver does not serve keeps its text (a picture: its
    description), marked and titled with the target, never a link to nowhere."""
    image, label, target = m.group("image") is not None, m.group("label"), m.group("target")
    scheme = re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", target)
    url = (target if _SAFE_SCHEME.match(target) else None) if scheme \
        else ctx.resolve(target, image)
    title = f' title="{escape(m.group("title"))}"' if m.group("title") else ""
    if image:
        alt = escape(label)
        if url is None:
            where = escape(ctx.outside(target))
            return f'<span class="missing-image" title="{where}">[{alt}]</span>'
        return f'<img src="{escape(url)}" alt="{alt}"{title} loading="lazy">'
    text = inline(label, ctx)
    if url is None:
        return f'<span class="outside" title="{escape(ctx.outside(target))}">{text}</span>'
    return f'<a href="{escape(url)}"{title}>{text}</a>'
