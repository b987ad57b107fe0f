"""Markdown to HTML, for the maths pages the server shows (docs/page.md, "The mathematics,
rendered"): the subset docs/ is written in, read the way GitHub reads it.

Blocks: ATX headings (with GitHub's ids, so `page.md#a-heading` lands), paragraphs, fenced code
(```math is a displayed formula, ```example a worked example), indented code, $$ formulas,
bullet and numbered lists (nested, tight or loose), tables (with column alignment), block
quotes, rules. Inline: sheepop.serve.documents.markdown_inline. No HTML passes through: every character
of the source is escaped, so a page cannot inject markup.

`render(text, resolve)` gives the page's HTML, its title and the TeX commands it could not draw.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from html import escape
from typing import NamedTuple

from sheepop.serve.documents.markdown_inline import Context, Resolve, inline, keep, plain

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([^`]*)$")
_HEADING = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
_RULE = re.compile(r"^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$")
_ITEM = re.compile(r"^( {0,3})([-*+]|[0-9]{1,9}[.)])(?:( {1,4})(.*)|[ \t]*$)")
_TABLE_RULE = re.compile(r"^ {0,3}\|?\s*:?-+:?\s*(?:\|\s*:?-+:?\s*)*\|?\s*$")
_QUOTE = re.compile(r"^ {0,3}> ?")


class Page(NamedTuple):
    html: str                     # the body: one element after another
    title: str                    # the first heading's text ("" when there is none)
    unsupported: tuple[str, ...]  # TeX commands shown as their source, in order


def render(text: str, resolve: Resolve = keep, outside: Callable[[str], str] = str) -> Page:
    """The Markdown `text` as HTML; each link's and picture's target goes through `resolve`,
    and one it does not serve is shown as text, titled `outside(target)`."""
    ctx = Context(resolve, outside)
    html = "\n".join(_blocks(text.replace("\r\n", "\n").split("\n"), ctx, tight=False))
    first = re.search(r"<h[1-6][^>]*>(.*?)</h[1-6]>", html, re.S)
    title = plain(re.sub(r'<a class="anchor".*?</a>', "", first.group(1))).strip() if first \
        else ""
    return Page(html, title, tuple(ctx.unsupported))


def _starts_block(line: str) -> bool:
    """Does `line` end a paragraph (a heading, a fence, a rule, a quote, a list, a formula)?"""
    item = _ITEM.match(line)
    return bool(_FENCE.match(line) or _HEADING.match(line) or _RULE.match(line)
                or _QUOTE.match(line) or line.lstrip().startswith("$$")
                or (item and item.group(4) and (not item.group(2)[0].isdigit()
                                                or item.group(2)[:-1] == "1")))


def _blocks(lines: list[str], ctx: Context, tight: bool) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
        elif m := _FENCE.match(line):
            i = _fenced(lines, i, m, ctx, out)
        elif line.lstrip().startswith("$$"):
            i = _display(lines, i, ctx, out)
        elif m := _HEADING.match(line):
            out.append(_heading(len(m.group(1)), m.group(2) or "", ctx))
            i += 1
        elif _RULE.match(line):
            out.append("<hr>")
            i += 1
        elif _QUOTE.match(line):
            quoted = []
            while i < len(lines) and _QUOTE.match(lines[i]):
                quoted.append(_QUOTE.sub("", lines[i], count=1))
                i += 1
            out.append("<blockquote>\n" + "\n".join(_blocks(quoted, ctx, False))
                       + "\n</blockquote>")
        elif _ITEM.match(line):
            i = _list(lines, i, ctx, out)
        elif line.startswith(("    ", "\t")):
            code = []
            while i < len(lines) and (lines[i].startswith(("    ", "\t")) or not lines[i].strip()):
                code.append(lines[i][4:] if lines[i].startswith("    ") else lines[i][1:])
                i += 1
            while code and not code[-1].strip():
                code.pop()
            source = "\n".join(code)
            out.append(f"<pre><code>{escape(source)}</code></pre>")
        elif "|" in line and i + 1 < len(lines) and _TABLE_RULE.match(lines[i + 1]) \
                and "-" in lines[i + 1]:
            i = _table(lines, i, ctx, out)
        else:
            para = [line.lstrip()]
            i += 1
            while i < len(lines) and lines[i].strip() and not _starts_block(lines[i]):
                para.append(lines[i].lstrip())
                i += 1
            html = inline("\n".join(para), ctx)
            out.append(html if tight else f"<p>{html}</p>")
    return out


def _fenced(lines: list[str], i: int, m: re.Match, ctx: Context, out: list[str]) -> int:
    fence, info = m.group(1), m.group(2).split()
    body = []
    i += 1
    while i < len(lines) and not re.match(rf"^ {{0,3}}{fence[0]}{{{len(fence)},}}\s*$", lines[i]):
        body.append(lines[i])
        i += 1
    source = "\n".join(body)
    kind = info[0] if info else ""
    if kind == "math":
        out.append(f'<div class="math-display">{ctx.math(source, True)}</div>')
    elif kind == "example":
        name = escape(info[1] if len(info) > 1 else "")
        out.append(f'<figure class="example"><figcaption>worked example <code>{name}</code>, '
                   f"checked by the tests</figcaption><pre><code>{escape(source)}</code></pre>"
                   "</figure>")
    else:
        language = f' class="language-{escape(kind)}"' if kind else ""
        out.append(f"<pre><code{language}>{escape(source)}</code></pre>")
    return i + 1


def _display(lines: list[str], i: int, ctx: Context, out: list[str]) -> int:
    """A formula between $$ and $$, on one line or several."""
    first = lines[i].strip()[2:]
    body = [first]
    if not (first.rstrip().endswith("$$")):
        i += 1
        while i < len(lines) and "$$" not in lines[i]:
            body.append(lines[i])
            i += 1
        body.append(lines[i] if i < len(lines) else "")
    source = "\n".join(body).rstrip()
    source = source[:-2] if source.endswith("$$") else source
    out.append(f'<div class="math-display">{ctx.math(source, True)}</div>')
    return i + 1


def _heading(level: int, source: str, ctx: Context) -> str:
    """<hN> with GitHub's id: the text in lower case, punctuation dropped, spaces to hyphens,
    -1, -2 ... after a repeat."""
    html = inline(source, ctx)
    slug = re.sub(r"[^\w\- ]", "", plain(html).strip().lower()).replace(" ", "-")
    seen = ctx.ids.get(slug, 0)
    ctx.ids[slug] = seen + 1
    slug = f"{slug}-{seen}" if seen else slug
    return (f'<h{level} id="{escape(slug)}">{html} <a class="anchor" href="#{escape(slug)}" '
            f'aria-label="link to this section">#</a></h{level}>')


def _list(lines: list[str], i: int, ctx: Context, out: list[str]) -> int:
    """A list: its items while the marker stays of one kind; an item is its first line and the
    lines indented past its marker (or lazily continuing its paragraph)."""
    first = _ITEM.match(lines[i])
    assert first
    ordered = first.group(2)[-1] in ".)" and first.group(2)[0].isdigit()
    kind = first.group(2)[-1] if ordered else first.group(2)
    items: list[list[str]] = []
    loose = False
    while i < len(lines):
        m = _ITEM.match(lines[i])
        if not m or (m.group(2)[-1] if ordered else m.group(2)) != kind \
                or (ordered != m.group(2)[0].isdigit()):
            break
        width = len(m.group(1)) + len(m.group(2)) + len(m.group(3) or " ")
        item = [m.group(4) or ""]
        i += 1
        while i < len(lines):
            line = lines[i]
            indented = len(line) - len(line.lstrip(" ")) >= width
            if line.strip() and (indented or (item[-1].strip() and not _starts_block(line)
                                              and not _ITEM.match(line))):
                item.append(line[width:] if indented else line)
            elif not line.strip() and i + 1 < len(lines) and (
                    len(lines[i + 1]) - len(lines[i + 1].lstrip(" ")) >= width
                    or _same_kind(lines[i + 1], kind, ordered)):
                item.append("")
                loose = loose or bool(lines[i + 1].strip())
            else:
                break
            i += 1
        items.append(item)
    tag = "ol" if ordered else "ul"
    start = int(first.group(2)[:-1]) if ordered else 1
    attributes = f' start="{start}"' if start != 1 else ""
    body = "".join("<li>" + "\n".join(_blocks(item, ctx, tight=not loose)) + "</li>\n"
                   for item in items)
    out.append(f"<{tag}{attributes}>\n{body}</{tag}>")
    return i


def _same_kind(line: str, kind: str, ordered: bool) -> bool:
    m = _ITEM.match(line)
    return bool(m) and (m.group(2)[-1] if ordered else m.group(2)) == kind


def _cells(row: str) -> list[str]:
    """A table row's cells: split at each | outside code spans and not escaped."""
    row = row.strip()
    row = row[1:] if row.startswith("|") else row
    row = row[:-1] if row.endswith("|") and not row.endswith("\\|") else row
    cells, current, ticks = [], "", 0
    for piece in re.split(r"(`+|\\\||\|)", row):
        if piece.startswith("`"):
            ticks = 0 if ticks == len(piece) else (ticks or len(piece))
        if piece == "|" and not ticks:
            cells.append(current)
            current = ""
        else:
            current += "|" if piece == "\\|" else piece
    return [c.strip() for c in [*cells, current]]


def _table(lines: list[str], i: int, ctx: Context, out: list[str]) -> int:
    head = _cells(lines[i])
    aligns = []
    for rule in _cells(lines[i + 1]):
        side = {(True, True): "center", (False, True): "right", (True, False): "left"}
        aligns.append(side.get((rule.startswith(":"), rule.endswith(":"))))
    i += 2
    rows = []
    while i < len(lines) and lines[i].strip() and "|" in lines[i]:
        rows.append(_cells(lines[i]))
        i += 1

    styles = [f' style="text-align: {a}"' if a else "" for a in aligns] + [""] * len(head)

    def row(cells: list[str], tag: str) -> str:
        padded = (cells + [""] * len(head))[:len(head)]
        return "<tr>" + "".join(f"<{tag}{style}>{inline(c, ctx)}</{tag}>"
                                for c, style in zip(padded, styles)) + "</tr>"

    body = "".join(row(r, "td") + "\n" for r in rows)
    out.append(f'<div class="table-scroll"><table>\n<thead>{row(head, "th")}</thead>\n'
               f"<tbody>\n{body}</tbody>\n</table></div>")
    return i
