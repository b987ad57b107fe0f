"""The commands of sheepop.serve.documents.mathml: each TeX command of the maths pages, read from the
parser's tokens (its arguments included) and written as MathML Core.

`command(p, name)` looks `name` up family by family (the tables are
sheepop.serve.documents.mathml_symbols); a name in no family becomes `p.unknown`, shown as its source.
"""

from __future__ import annotations

import re
from html import escape
from typing import NamedTuple, Protocol

from sheepop.serve.documents import mathml_symbols as sym

_PLAIN_NAME = re.compile(r"[A-Za-z0-9 .\-]+")


class Atom(NamedTuple):
    markup: str
    limits: bool = False     # scripts go under and over (a display's \sum, \max, \underbrace)
    function: bool = False   # an upright name: a thin space before its argument


class Parser(Protocol):
    """What a command reads its arguments from: sheepop.serve.documents.mathml.Parser."""

    def peek(self) -> str: ...
    def take(self) -> str: ...
    def raw_group(self) -> str: ...
    def optional(self) -> str | None: ...
    def argument(self) -> str: ...
    def row(self, stops: tuple[str, ...]) -> list[str]: ...
    def sub(self, tex: str) -> Parser: ...
    def unknown(self, source: str) -> Atom: ...


def mrow(nodes: list[str], always: bool = False) -> str:
    """The nodes as one element: an <mrow> unless there is one node (or `always`)."""
    return nodes[0] if len(nodes) == 1 and not always else f"<mrow>{''.join(nodes)}</mrow>"


def text(raw: str) -> str:
    """Text mode: TeX's escapes undone, edge spaces kept (no-break), then escaped."""
    plain = re.sub(r"\\([_#%&${} ])", r"\1", raw)
    plain = re.sub(r"^ | $", "\u00a0", re.sub(r"\s+", " ", plain))
    return escape(plain)


def operator(char: str) -> Atom:
    """<mo>, a fence kept at the text's size (sym.UNSTRETCHED)."""
    fixed = ' stretchy="false"' if char in sym.UNSTRETCHED else ""
    return Atom(f"<mo{fixed}>{escape(char)}</mo>")


def command(p: Parser, name: str) -> Atom:
    """The command \\name, its arguments read from `p`."""
    if name in sym.GREEK:
        return Atom(f"<mi>{sym.GREEK[name]}</mi>")
    if name in sym.UPPER_GREEK:
        return Atom(f'<mi mathvariant="normal">{sym.UPPER_GREEK[name]}</mi>')
    if name in sym.IDENTIFIERS:
        return Atom(f"<mi>{sym.IDENTIFIERS[name]}</mi>")
    if name in sym.OPERATORS:
        return operator(sym.OPERATORS[name])
    if name in sym.IGNORED:
        if name in ("label", "tag"):
            p.raw_group()
        return Atom("<mrow></mrow>")
    if name in sym.ESCAPED:
        return Atom(f"<mi>{escape(sym.ESCAPED[name])}</mi>")
    if name in sym.SPACES:
        return Atom(f'<mspace width="{sym.SPACES[name]}"/>')
    if name in sym.LARGE_OPERATORS:
        return Atom(f'<mo largeop="true" movablelimits="true">'
                     f"{sym.LARGE_OPERATORS[name]}</mo>", limits=True)
    if name in sym.FUNCTIONS:
        return Atom(f"<mi>{name}</mi>", function=True)
    if name in sym.LIMIT_FUNCTIONS:
        return Atom(f'<mo form="prefix" movablelimits="true" lspace="0" rspace="0">{name}'
                     "</mo>", limits=True, function=True)
    if name in sym.FRACTIONS:
        fraction = f"<mfrac>{p.argument()}{p.argument()}</mfrac>"
        style = sym.FRACTIONS[name]
        return Atom(fraction if style is None
                     else f'<mrow displaystyle="{style}">{fraction}</mrow>')
    if name == "binom":
        return Atom(f'<mrow><mo>(</mo><mfrac linethickness="0">{p.argument()}'
                     f"{p.argument()}</mfrac><mo>)</mo></mrow>")
    if name == "sqrt":
        index = p.optional()
        if index is not None:
            root = mrow(p.sub(index).row(()))
            return Atom(f"<mroot>{p.argument()}{root}</mroot>")
        return Atom(f"<msqrt>{p.argument()}</msqrt>")
    if name in sym.TEXT:
        content = text(p.raw_group())
        tag = '<mtext class="tt">' if name == "texttt" else "<mtext>"
        return Atom(f"{tag}{content}</mtext>")
    if name in ("mathrm", "operatorname", "textup", "mathop"):
        return upright(p, function=name != "mathrm")
    if name in sym.ALPHABETS:
        return alphabet(p, sym.ALPHABETS[name])
    if name in sym.ACCENTS:
        accent = escape(sym.ACCENTS[name])
        stretchy = "true" if name.startswith(("wide", "over")) else "false"
        return Atom(f'<mover accent="true">{p.argument()}<mo stretchy="{stretchy}">'
                     f"{accent}</mo></mover>")
    if name in sym.UNDER or name in sym.OVER:
        tag, mark = ("munder", sym.UNDER[name]) if name in sym.UNDER \
            else ("mover", sym.OVER[name])
        return Atom(f'<{tag}>{p.argument()}<mo stretchy="true">{mark}</mo></{tag}>',
                     limits=True)
    if name in ("overset", "underset", "stackrel"):
        mark, base = p.argument(), p.argument()
        tag = "munder" if name == "underset" else "mover"
        return Atom(f"<{tag}>{base}{mark}</{tag}>")
    if name in ("mathrel", "mathbin"):
        inner = p.argument()
        single = re.fullmatch(r"<mo[^>]*>([^<]*)</mo>", inner)
        if single and p.peek() == "=":  # \mathrel{+}= is the operator +=
            p.take()
            return Atom(f"<mo>{single.group(1)}=</mo>")
        if single:
            width = "0.2778em" if name == "mathrel" else "0.2222em"
            return Atom(f'<mo lspace="{width}" rspace="{width}">{single.group(1)}</mo>')
        return Atom(mrow([inner], always=True))
    if name.rstrip("lrm") in sym.SIZED:
        return fence(p, sym.SIZED[name.rstrip("lrm")])
    if name == "left":
        return left_right(p)
    if name == "begin":
        return environment(p, p.raw_group())
    return p.unknown("\\" + name)


def upright(p: Parser, function: bool) -> Atom:
    """\\mathrm{...}, \\operatorname{...}; \\operatorname*{argmax} takes its limits underneath."""
    limits = function and p.peek() == "*" and p.take() == "*"
    raw = p.raw_group()
    if _PLAIN_NAME.fullmatch(raw):
        name = escape(raw.strip())
        if limits:
            return Atom(f'<mo form="prefix" movablelimits="true" lspace="0" rspace="0">{name}'
                        "</mo>", limits=True, function=True)
        variant = ' mathvariant="normal"' if len(name) == 1 else ""
        return Atom(f"<mi{variant}>{name}</mi>", function=function)
    return Atom(mrow(p.sub(raw).row(()), always=True), limits=limits, function=function)


def alphabet(p: Parser, alphabet: str) -> Atom:
    raw = p.raw_group()
    if re.fullmatch(r"[A-Za-z0-9]+", raw):
        text = "".join(sym.styled(c, alphabet) for c in raw)
        tag = "mn" if raw.isdigit() else "mi"
        return Atom(f"<{tag}>{text}</{tag}>")
    return Atom(mrow(p.sub(raw).row(()), always=True))

def delimiter(p: Parser) -> str:
    token = p.take()
    if token in (".", ""):
        return ""
    if token.startswith("\\") and token[1:] in sym.OPERATORS:
        return escape(sym.OPERATORS[token[1:]])
    return escape(token)

def fence(p: Parser, size: str) -> Atom:
    char = delimiter(p)
    return Atom(f'<mo minsize="{size}" maxsize="{size}" stretchy="true" symmetric="true">'
                 f"{char}</mo>")

def left_right(p: Parser) -> Atom:
    opening = delimiter(p)
    inner = p.row(stops=("\\right",))
    closing = delimiter(p) if p.take() == "\\right" else ""
    return Atom(f'<mrow><mo fence="true" form="prefix">{opening}</mo>{"".join(inner)}'
                 f'<mo fence="true" form="postfix">{closing}</mo></mrow>')

def environment(p: Parser, name: str) -> Atom:
    columns = p.raw_group() if name == "array" else ""
    rows: list[list[str]] = [[]]
    while True:
        rows[-1].append(mrow(p.row(stops=("&", "\\\\", "\\end")), always=True))
        token = p.take()
        if token == "&":
            continue
        if token == "\\\\":
            p.optional()
            rows.append([])
            continue
        if token == "\\end":
            p.raw_group()
        break
    if rows[-1] == ["<mrow></mrow>"] and len(rows) > 1:  # a trailing \\
        rows.pop()
    if name not in sym.MATRICES:
        p.unknown(f"\\begin{{{name}}}")
    table = "".join("<mtr>" + "".join(cell(name, j, c, columns) for j, c in enumerate(row))
                    + "</mtr>" for row in rows)
    style = ' displaystyle="true"' if name in ("aligned", "align", "align*", "split",
                                               "gathered") else ""
    left, right = sym.MATRICES.get(name, ("", ""))
    fences = [f"<mo>{escape(left)}</mo>" if left else "", f"<mtable{style}>{table}</mtable>",
              f"<mo>{escape(right)}</mo>" if right else ""]
    return Atom(mrow(fences, always=True))


def cell(environment: str, column: int, content: str, spec: str) -> str:
    """One <mtd>: aligned's columns pair up (right-aligned, then left-aligned, TeX's `&=`),
    cases' are left-aligned, an array's follow its column letters. MathML Core has no column
    alignment: Chromium places a cell's content by `text-align: -webkit-right`, the others read
    `columnalign`; both are given."""
    side, pad = "center", ""
    if environment in ("aligned", "align", "align*", "split"):
        side = "right" if column % 2 == 0 else "left"
        pad = "; padding-right: 0" if side == "right" else "; padding-left: 0"
        pad += "; padding-left: 1.5em" if side == "right" and column else ""
    elif environment == "cases":
        side = "left"
    elif column < len(letters := [c for c in spec if c in "lcr"]):
        side = {"l": "left", "c": "center", "r": "right"}[letters[column]]
    if side == "center" and not pad:
        return f"<mtd>{content}</mtd>"
    return (f'<mtd columnalign="{side}" style="text-align: -webkit-{side}{pad}">'
            f"{content}</mtd>")
