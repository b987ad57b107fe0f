"""TeX formulas to MathML Core, which Chromium, Firefox and Safari draw themselves: the maths
pages need no JavaScript renderer (docs/page.md, "The mathematics, rendered").

`to_mathml(tex, display)` reads the subset of TeX that docs/math and docs/derivations use:
letters, numbers and operators; sub- and superscripts (under and over a \\sum, \\prod, \\max in
a display); \\frac, \\dfrac, \\tfrac, \\sqrt, \\binom; Greek letters; \\mathbf, \\mathbb and the
other alphabets; \\text, \\mathrm, \\operatorname; accents (\\hat, \\bar, ...), \\underbrace;
\\left ... \\right and \\big-sized fences; spaces (\\, \\; \\quad ...); the environments pmatrix,
bmatrix, cases, aligned and their kin, with & and \\\\. A command outside it is shown as its
source in a <code class="tex-unsupported"> and listed in `Math.unsupported`: never dropped.

Every character of the source reaches the output through html.escape: a formula cannot inject
markup. The source itself rides along as the <annotation> (copy, search, screen readers).
"""

from __future__ import annotations

import re
from html import escape
from typing import NamedTuple

from sheepop.serve.documents.mathml_commands import Atom, command, mrow, operator

_TOKEN = re.compile(r"\\([a-zA-Z]+|.)|(%[^\n]*)|(\s+)|(.)", re.S)
_THIN = '<mspace width="0.1667em"/>'
_NO_SPACE = ("(", "\\left", "^", "_", "\\big", "\\Big", "\\bigl", "\\Bigl", "\\!", "\\,", "")


class Math(NamedTuple):
    markup: str                   # one <math> element
    unsupported: tuple[str, ...]  # the commands shown as their source, in order


def to_mathml(tex: str, display: bool = False) -> Math:
    """The formula `tex` as a <math> element, a block when `display` (TeX's $$...$$)."""
    parser = Parser(tex)
    try:
        lines = [parser.row(stops=("\\\\",))]
        while parser.take() == "\\\\":  # lines outside an environment: one centred column
            parser.optional()
            lines.append(parser.row(stops=("\\\\",)))
        body = mrow(lines[0], always=True) if len(lines) == 1 else (
            '<mrow><mtable displaystyle="true">' + "".join(
                f"<mtr><mtd>{mrow(line, always=True)}</mtd></mtr>" for line in lines if line)
            + "</mtable></mrow>")
    except RecursionError:  # braces nested thousands deep: show the source
        parser.unsupported = ["(nesting too deep)"]
        body = f'<mrow><mtext><code class="tex-unsupported">{escape(tex)}</code></mtext></mrow>'
    head = '<math display="block">' if display else "<math>"
    return Math(f'{head}<semantics>{body}<annotation encoding="application/x-tex">'
                f"{escape(tex)}</annotation></semantics></math>", tuple(parser.unsupported))


def _operand_expected(nodes: list[str]) -> bool:
    """After nothing, or after an operator that is not a closing fence (= - or ( -), a minus
    is a sign: TeX sets it with no space around it."""
    if not nodes:
        return True
    last = re.fullmatch(r"<mo[^>]*>([^<]*)</mo>", nodes[-1])
    return bool(last) and last.group(1) not in (")", "]", "|", "}", "\u2016", "\u230b", "\u2309")


class Parser:
    """A formula as tokens (\\name, one character, a space), read left to right: rows of atoms,
    each with its scripts; commands are read by sheepop.serve.documents.mathml_commands."""

    def __init__(self, tex: str):
        self.tokens: list[str] = []
        for m in _TOKEN.finditer(tex):
            if m.group(1) is not None:
                self.tokens.append("\\" + m.group(1))
            elif m.group(3) is not None:
                self.tokens.append(" ")
            elif m.group(4) is not None:
                self.tokens.append(m.group(4))
        self.i = 0
        self.unsupported: list[str] = []

    def peek(self) -> str:
        while self.i < len(self.tokens) and self.tokens[self.i] == " ":
            self.i += 1
        return self.tokens[self.i] if self.i < len(self.tokens) else ""

    def take(self) -> str:
        token = self.peek()
        self.i += 1
        return token

    def raw_group(self) -> str:
        """The source of the next {...} argument (or of the next token), braces balanced."""
        if self.peek() != "{":
            return self.take()
        self.i += 1
        depth, out = 1, []
        while self.i < len(self.tokens):
            token = self.tokens[self.i]
            self.i += 1
            depth += (token == "{") - (token == "}")
            if depth == 0:
                break
            out.append(token)
        return "".join(out)

    def optional(self) -> str | None:
        """An optional [...] argument (\\sqrt[3], the spacing of \\\\[2ex]), or None."""
        if self.peek() != "[":
            return None
        self.i += 1
        out = []
        while self.i < len(self.tokens) and self.tokens[self.i] != "]":
            out.append(self.tokens[self.i])
            self.i += 1
        self.i += 1
        return "".join(out)

    def sub(self, tex: str) -> Parser:
        """A parser of `tex` (an argument read raw) that reports to this one's list."""
        inner = Parser(tex)
        inner.unsupported = self.unsupported
        return inner

    def unknown(self, source: str) -> Atom:
        self.unsupported.append(source)
        return Atom(f'<mtext><code class="tex-unsupported">{escape(source)}</code></mtext>')

    # ----- rows, atoms and their scripts ---------------------------------------------------------

    def row(self, stops: tuple[str, ...]) -> list[str]:
        """Atoms with their scripts up to (not including) one of `stops` or the end."""
        nodes: list[str] = []
        while (token := self.peek()) != "" and token not in stops:
            if token in ("\\displaystyle", "\\textstyle"):
                self.i += 1
                style = "true" if token == "\\displaystyle" else "false"
                nodes.append(f'<mrow displaystyle="{style}">{"".join(self.row(stops))}</mrow>')
                break
            if token in ("\\limits", "\\nolimits"):
                self.i += 1
                continue
            if token in ("-", "+") and _operand_expected(nodes):  # a sign, not an operation
                self.i += 1
                sign = "\u2212" if token == "-" else "+"
                nodes.append(f'<mo lspace="0" rspace="0">{sign}</mo>')
                continue
            atom = self.atom(merge_digits=True)
            nodes.append(self.scripts(atom))
            if atom.function and self.peek() not in _NO_SPACE:
                nodes.append(_THIN)
        return nodes

    def argument(self) -> str:
        """One argument: a {group}, or the single next token (\\frac12 is \\frac{1}{2})."""
        if self.peek() == "{":
            self.i += 1
            nodes = self.row(stops=("}",))
            self.i += 1
            if len(nodes) == 1 and nodes[0].startswith("<mo>"):  # {:} is an ordinary symbol
                nodes = ['<mo lspace="0" rspace="0">' + nodes[0][4:]]
            return mrow(nodes)
        if self.peek() in ("", "}", "&", "\\\\"):
            return "<mrow></mrow>"
        return self.atom(merge_digits=False).markup

    def scripts(self, base: Atom) -> str:
        sub = sup = None
        primes = ""
        while True:
            token = self.peek()
            if token == "_" and sub is None:
                self.i += 1
                sub = self.argument()
            elif token == "^" and sup is None:
                self.i += 1
                sup = self.argument()
            elif token == "'":
                self.i += 1
                primes += "\u2032"
            else:
                break
        if primes:  # the prime glyph is already raised: at script size it would be a speck
            base = Atom(f'<mrow>{base.markup}<mo lspace="0" rspace="0">{primes}</mo></mrow>')
        if sub is None and sup is None:
            return base.markup
        under, over, both = ("munder", "mover", "munderover") if base.limits \
            else ("msub", "msup", "msubsup")
        if sup is None:
            return f"<{under}>{base.markup}{sub}</{under}>"
        if sub is None:
            return f"<{over}>{base.markup}{sup}</{over}>"
        return f"<{both}>{base.markup}{sub}{sup}</{both}>"

    def atom(self, merge_digits: bool) -> Atom:
        token = self.take()
        if token == "{":
            self.i -= 1
            return Atom(self.argument())
        if token.startswith("\\") and len(token) > 1:
            return command(self, token[1:])
        if token.isdigit():
            number = token
            while merge_digits and self.i < len(self.tokens):
                nxt = self.tokens[self.i]
                if nxt.isdigit() or (nxt == "." and self.i + 1 < len(self.tokens)
                                     and self.tokens[self.i + 1].isdigit()):
                    number += nxt
                    self.i += 1
                else:
                    break
            return Atom(f"<mn>{number}</mn>")
        if token.isalpha():
            return Atom(f"<mi>{escape(token)}</mi>")
        if token == "~":
            return Atom("<mtext>\u00a0</mtext>")
        return operator({"-": "\u2212", "*": "\u2217"}.get(token, token))
