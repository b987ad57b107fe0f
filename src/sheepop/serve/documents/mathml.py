"""TeX formulas to MathML, which Chromium, Firefox and Safari draw themselves: the maths pages
need no JavaScript renderer (docs/page.md, "The mathematics, rendered").

latex2mathml reads the TeX; this module adds what the pages need around it, each measured on
docs/ (docs/page.md lists them):

- safety: latex2mathml's own `convert` unescapes its whole output (to keep the `&#x2211;` it
  writes), so `\\text{<b>}` would become markup. The element tree is serialised here instead,
  each character reference turned into its character first, so every character of the source
  reaches the page escaped;
- `aligned`, which latex2mathml does not know (it draws `&` as a letter), is read as `align*`
  (the same columns: right, left, right, left), and each environment as a group;
- what TeX typesets and latex2mathml leaves to the browser (`_as_tex_sets`);
- a command or an environment it does not know (shown as `\\foo` in an <mi>, or dropped), or a
  formula it cannot read at all, is shown as its source in a <code class="tex-unsupported"> and
  listed in `Math.unsupported`: never dropped.

The source rides along as the <annotation> (copy, search, screen readers).
"""

from __future__ import annotations

import re
from typing import NamedTuple
from xml.etree.ElementTree import Element, SubElement, tostring

import latex2mathml.commands
import latex2mathml.converter
import latex2mathml.exceptions

_REFERENCE = re.compile(r"&#x([0-9A-Fa-f]+);")
_ENVIRONMENT = re.compile(r"\\begin\{([^}]*)\}")
_KNOWN_ENVIRONMENTS = {name.lstrip("\\") for name in (
    *latex2mathml.commands.MATRICES, latex2mathml.commands.ALIGN,
    latex2mathml.commands.ALIGNSTAR, latex2mathml.commands.SPLIT)} | {"aligned"}
_CANNOT_READ = (RecursionError, *(e for e in vars(latex2mathml.exceptions).values()
                                  if isinstance(e, type) and issubclass(e, Exception)))
"""latex2mathml's errors (a missing argument, an unclosed environment), and braces nested
deeper than Python's stack."""


_SCRIPTS = {"msub": "munder", "msup": "mover", "msubsup": "munderover"}
_LARGE_OPERATORS = frozenset("\u2211\u220f\u2210\u22c3\u22c2")
"""sum, product, coproduct, big union and intersection: limits under and over in a display
(latex2mathml writes them so only at a formula's top level, not inside a root or \\left)."""
_FENCES = frozenset("()[]{}|\u2016\u2223\u230a\u230b\u2308\u2309\u27e8\u27e9")
"""Fences that TeX keeps at the text's size unless \\left, \\right or \\big asks."""
_NAMED_SPACES = {"negativethinmathspace": "-0.1667em", "thinmathspace": "0.1667em",
                 "mediummathspace": "0.2222em", "thickmathspace": "0.2778em"}
"""MathML 3's named widths, which MathML Core does not read (latex2mathml writes \\! so)."""
_ROWS = ("mrow", "mtd", "msqrt", "mstyle", "mpadded", "mphantom", "menclose")
"""The elements whose children are laid out in a row (the others have a fixed number)."""


class Math(NamedTuple):
    markup: str                   # one <math> element
    unsupported: tuple[str, ...]  # what is shown as its source, in order


def to_mathml(tex: str, display: bool = False) -> Math:
    """The formula `tex` as a <math> element, a block when `display` (TeX's $$...$$)."""
    unsupported = [f"\\begin{{{name}}}" for name in _ENVIRONMENT.findall(tex)
                   if name not in _KNOWN_ENVIRONMENTS]
    try:
        body = latex2mathml.converter.convert_to_element(
            _as_latex2mathml_reads(tex), display="block" if display else "inline")[0]
    except _CANNOT_READ as e:
        unsupported.append(f"(cannot read: {type(e).__name__})")
        body = Element("mrow")
        _source(SubElement(body, "mtext"), tex)
    for element in body.iter():
        element.text = _characters(element.text)
        element.tail = _characters(element.tail)
        if element.tag in ("mi", "mo") and re.fullmatch(r"\\[A-Za-z]+.*", element.text or ""):
            unsupported.append(element.text)
            element.tag, element.attrib = "mtext", {}
            _source(element, element.text)
    _as_tex_sets(body)
    math = Element("math", {"display": "block"} if display else {})
    semantics = SubElement(math, "semantics")
    semantics.append(body)
    SubElement(semantics, "annotation", {"encoding": "application/x-tex"}).text = tex
    return Math(tostring(math, encoding="unicode", short_empty_elements=False),
                tuple(unsupported))


def _as_latex2mathml_reads(tex: str) -> str:
    """`aligned` as `align*`; each environment a group of its own, so that the fences of a
    pmatrix stretch to its own height, not to the tallest thing on its line."""
    tex = re.sub(r"\\(begin|end)\{aligned\}", r"\\\1{align*}", tex)
    tex = re.sub(r"\\\\\[[^\]]*\]", r"\\\\", tex)  # (\\[2ex]: latex2mathml shows [2ex])
    return re.sub(r"\\end\{[^}]*\}", lambda m: m.group(0) + "}",
                  re.sub(r"\\begin\{", "{\\\\begin{", tex))


def _as_tex_sets(body: Element) -> None:
    """What TeX does and latex2mathml's output does not, in Chromium (which reads MathML Core:
    no `mathvariant` but "normal", no named widths, no automatic spacing after a function's
    name)."""
    for element in list(body.iter()):
        _upright(element)
        _scripted(element)
        if element.tag == "mspace" and element.get("width") in _NAMED_SPACES:
            element.set("width", _NAMED_SPACES[element.get("width")])
    for element in list(body.iter()):
        _text_sized(element)
        _spaces(element)


def _scripted(element: Element) -> None:
    """A sum's limits go under and over it in a display; a prime stands beside its letter."""
    if element.tag in _SCRIPTS and element[0].tag == "mo" and element[0].text in _LARGE_OPERATORS:
        element.tag = _SCRIPTS[element.tag]
    elif element.tag in ("msup", "msubsup"):
        _primes_beside(element)


def _text_sized(parent: Element) -> None:
    """\\lVert, \\{ and their kin stay at the text's size, as a plain ( does (a matrix's fences
    stretch to its height)."""
    if any(child.tag == "mtable" for child in parent):
        return
    for fence in parent:
        if fence.tag == "mo" and not fence.attrib and fence.text in _FENCES:
            fence.set("stretchy", "false")


def _upright(element: Element) -> None:
    """A name (\\operatorname, \\max) is an upright identifier, with no operator's spacing
    around it; upper-case Greek is upright; \\texttt is monospace; text shows \\_ as _."""
    text = element.text or ""
    if element.tag == "mo" and len(text) > 1 and text.isalpha() \
            and "movablelimits" not in element.attrib:  # (\operatorname*: limits under)
        element.tag, element.attrib = "mi", {}
    elif element.tag == "mi" and re.fullmatch("[\u0391-\u03a9]", text):
        element.set("mathvariant", "normal")
    elif element.tag == "mtext":
        element.text = re.sub(r"\\([_#%&${}])", r"\1", text)
        if element.attrib.pop("mathvariant", None) == "monospace":
            element.set("class", "tt")


def _spaces(row: Element) -> None:
    """A minus after an operator is a sign, set close to its operand (= -1); a thin space
    follows a function's name (\\sin x) unless a bracket does."""
    if row.tag not in _ROWS:
        return
    for before, sign in zip(row[:-1], row[1:]):
        if _is_sign(before, sign):
            sign.set("lspace", "0")
            sign.set("rspace", "0")
    for k in range(len(row) - 2, -1, -1):
        if _is_name(row[k]) and not _spaced_or_bracketed(row[k + 1]):
            row.insert(k + 1, Element("mspace", {"width": "0.1667em"}))


def _spaced_or_bracketed(element: Element) -> bool:
    """Whether what follows a function's name is a bracket (\\left( too) or a space the formula
    sets itself (\\tanh\\!\\left(): TeX adds no thin space there."""
    if element.tag == "mrow" and len(element):
        element = element[0]
    return element.tag == "mspace" or bool(re.fullmatch(r"[(\[|{\u2016]", element.text or ""))


def _is_sign(before: Element, element: Element) -> bool:
    """A + or - right after an operator that is not a closing fence."""
    return element.tag == "mo" and element.text in ("\u2212", "+") and before.tag == "mo" \
        and before.text not in (")", "]", "|", "}", "\u2016")


def _primes_beside(scripted: Element) -> None:
    """x' is written x^{\\prime}: the prime glyph is already raised, and at a superscript's size
    it is a speck. It is set beside its base at full size, as TeX's fonts draw it."""
    prime = scripted[-1]
    if not re.fullmatch("[\u2032-\u2034]+", "".join(prime.itertext())):
        return
    base = Element("mrow")
    base.append(scripted[0])
    SubElement(base, "mo", {"lspace": "0", "rspace": "0"}).text = "".join(prime.itertext())
    scripts = list(scripted)[1:-1]
    scripted[:] = [base, *scripts]
    if not scripts:
        scripted.tag = "mrow"
        scripted[:] = list(base)
    else:
        scripted.tag = "msub"


def _is_name(element: Element) -> bool:
    """An upright name of several letters (sin, softmax), alone or under its scripts."""
    if element.tag in (*_SCRIPTS, *_SCRIPTS.values()) and len(element):
        element = element[0]
    text = element.text or ""
    return element.tag == "mi" and len(text) > 1 and text.isalpha()


def _characters(text: str | None) -> str | None:
    """latex2mathml's character references (`&#x02211;`) as the characters themselves."""
    return text and _REFERENCE.sub(lambda m: chr(int(m.group(1), 16)), text)


def _source(element: Element, tex: str) -> None:
    """`element` shows `tex` as code, marked as not drawn."""
    element.text = None
    element[:] = []
    SubElement(element, "code", {"class": "tex-unsupported"}).text = tex
