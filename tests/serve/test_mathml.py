"""TeX to MathML (sheepop.serve.documents.mathml: latex2mathml, and what TeX sets that it does
not): exact markup for each construct the maths pages use and for each of our additions (each
fails without it), escaping, the commands it does not know shown and listed, and every formula
of docs/math (and docs/derivations, the derivations the maths pages link to) read without one
unsupported command."""

import re
from pathlib import Path

import pytest

from sheepop.serve.documents import shown
from sheepop.serve.documents.mathml import to_mathml

DOCS = Path(__file__).resolve().parents[2] / "docs"


def body(tex: str, display: bool = True) -> str:
    """The formula's MathML between <semantics> and its <annotation>."""
    markup = to_mathml(tex, display).markup
    return markup[markup.index("<semantics>") + 11:markup.index("<annotation")]


def test_the_whole_element_carries_its_source_as_the_annotation():
    assert to_mathml("x", display=True).markup == (
        '<math display="block"><semantics><mrow><mi>x</mi></mrow>'
        '<annotation encoding="application/x-tex">x</annotation></semantics></math>')
    assert to_mathml("a<b", display=False).markup == (
        "<math><semantics><mrow><mi>a</mi><mo>&lt;</mo><mi>b</mi></mrow>"
        '<annotation encoding="application/x-tex">a&lt;b</annotation></semantics></math>')


@pytest.mark.parametrize("tex, mathml", [
    (r"x^2", "<mrow><msup><mi>x</mi><mn>2</mn></msup></mrow>"),
    (r"\frac{a}{\sqrt{d_k}}", "<mrow><mfrac><mrow><mi>a</mi></mrow><mrow><msqrt><mrow><msub>"
                              "<mi>d</mi><mi>k</mi></msub></mrow></msqrt></mrow></mfrac></mrow>"),
    (r"\sum_{i=1}^{n} x_i", "<mrow><munderover><mo>\u2211</mo><mrow><mi>i</mi><mo>=</mo><mn>1</mn>"
                            "</mrow><mrow><mi>n</mi></mrow></munderover><msub><mi>x</mi><mi>i</mi>"
                            "</msub></mrow>"),
    (r"\mathbb{R}^{d}, \mathbf{x}", "<mrow><msup><mi>\u211d</mi><mrow><mi>d</mi></mrow></msup>"
                                  "<mo>,</mo><mi>\U0001d431</mi></mrow>"),
    (r"\begin{cases} 0 & a \\ 1 & b \end{cases}",
     '<mrow><mrow><mrow><mo stretchy="true" fence="true" form="prefix">{</mo><mtable><mtr>'
     '<mtd columnalign="left"><mn>0</mn></mtd><mtd columnalign="left"><mi>a</mi></mtd></mtr><mtr>'
     '<mtd columnalign="left"><mn>1</mn></mtd><mtd columnalign="left"><mi>b</mi></mtd></mtr>'
     "</mtable></mrow></mrow></mrow>"),
    # ours: aligned is read as align* (latex2mathml draws its & as letters)
    (r"\begin{aligned} a &= b \\ d &= e \end{aligned}",
     '<mrow><mrow><mtable displaystyle="true" rowspacing="3pt" columnspacing="0em 2em"><mtr>'
     '<mtd columnalign="right"><mi>a</mi></mtd><mtd columnalign="left"><mi></mi><mo>=</mo>'
     '<mi>b</mi></mtd></mtr><mtr><mtd columnalign="right"><mi>d</mi></mtd><mtd columnalign="left">'
     "<mi></mi><mo>=</mo><mi>e</mi></mtd></mtr></mtable></mrow></mrow>"),
    # ours: an environment is a group, so its fences stretch to it alone
    (r"\begin{pmatrix} a \\ b \end{pmatrix} = \underbrace{x}_{y}",
     "<mrow><mrow><mo>(</mo><mtable><mtr><mtd><mi>a</mi></mtd></mtr><mtr><mtd><mi>b</mi></mtd>"
     "</mtr></mtable><mo>)</mo></mrow><mo>=</mo><munder><munder><mrow><mi>x</mi></mrow>"
     "<mo>\u23df</mo></munder><mrow><mi>y</mi></mrow></munder></mrow>"),
    # ours: a name is an identifier, a function's name is followed by a thin space
    (r"\operatorname{Var}(x) = \cos \omega",
     '<mrow><mi>Var</mi><mo stretchy="false">(</mo><mi>x</mi><mo stretchy="false">)</mo><mo>=</mo>'
     '<mi>cos</mi><mspace width="0.1667em"></mspace><mi>\u03c9</mi></mrow>'),
    # ours: ... none before a bracket, \left( included, nor where the formula sets a space (\!,
    # a named width MathML Core does not read, as em)
    (r"\tanh\left( x \right) \sin\!x", '<mrow><mi>tanh</mi><mrow><mo stretchy="true" '
                                            'fence="true" form="prefix">(</mo><mi>x</mi><mo '
                                            'stretchy="true" fence="true" form="postfix">)</mo>'
                                            '</mrow><mi>sin</mi><mspace width="-0.1667em">'
                                            "</mspace><mi>x</mi></mrow>"),
    # ours: upper-case Greek upright
    (r"\Phi", '<mrow><mi mathvariant="normal">\u03a6</mi></mrow>'),
    # ours: \texttt monospace, its \_ an underscore
    (r"\texttt{tok\_emb}", '<mrow><mtext class="tt">tok_emb</mtext></mrow>'),
    # ours: a prime beside its letter, not a superscript
    (r"x'_{2i}", '<mrow><msub><mrow><mi>x</mi><mo lspace="0" rspace="0">\u2032</mo></mrow><mrow>'
                 "<mn>2</mn><mi>i</mi></mrow></msub></mrow>"),
    # ours: a sum's limits under it inside \left( \right) too
    (r"\left( \sum_i x_i \right)",
     '<mrow><mrow><mo stretchy="true" fence="true" form="prefix">(</mo><munder><mo>\u2211</mo>'
     '<mi>i</mi></munder><msub><mi>x</mi><mi>i</mi></msub><mo stretchy="true" fence="true" '
     'form="postfix">)</mo></mrow></mrow>'),
    # ours: \lVert at the text's size; a minus after = is a sign
    (r"\lVert g \rVert = -1", '<mrow><mo stretchy="false">\u2016</mo><mi>g</mi>'
                             '<mo stretchy="false">\u2016</mo><mo>=</mo>'
                             '<mo lspace="0" rspace="0">\u2212</mo><mn>1</mn></mrow>'),
])
def test_each_construct(tex, mathml):
    assert body(tex) == mathml
    assert to_mathml(tex).unsupported == ()


def test_a_rows_extra_spacing_is_read_not_shown():
    """\\\\[2ex] (docs/math/11-schedule.md): latex2mathml would show "[2ex]"."""
    assert body(r"\begin{cases} 0 & a \\[2ex] 1 & b \end{cases}") == \
        body(r"\begin{cases} 0 & a \\ 1 & b \end{cases}")


def test_an_unknown_command_is_shown_as_its_source_and_listed():
    formula = to_mathml(r"\foo{x} + \begin{weird} y \end{weird}")
    assert formula.unsupported == ("\\begin{weird}", "\\foo")
    assert body(r"\foo{x}") == ('<mrow><mtext><code class="tex-unsupported">\\foo</code>'
                                "</mtext><mrow><mi>x</mi></mrow></mrow>")


def test_nothing_in_a_formula_becomes_markup():
    """latex2mathml's own `convert` would let \\text{<script>} through as markup."""
    formula = to_mathml(r'\text{<script>alert(1)</script>} \foo<img src=x> "&')
    assert "<script" not in formula.markup and "<img" not in formula.markup
    assert "&lt;script&gt;" in formula.markup and "&amp;" in formula.markup


def test_broken_input_still_gives_a_formula():
    assert body(r"\frac{a}{b") == ("<mrow><mfrac><mrow><mi>a</mi></mrow><mrow><mi>b</mi></mrow>"
                                  "</mfrac></mrow>")
    broken = to_mathml(r"\frac")
    assert broken.unsupported == ("(cannot read: NoAvailableTokensError)",)
    assert '<code class="tex-unsupported">\\frac</code>' in broken.markup
    deep = to_mathml("{" * 5000 + "x")  # deeper than Python's stack
    assert deep.unsupported == ("(cannot read: RecursionError)",)
    assert deep.markup.startswith("<math>")


def formulas(page: Path) -> list[str]:
    """Every formula of a page: ```math blocks, $$...$$ and $...$ (outside code)."""
    text = page.read_text(encoding="utf-8")
    found = re.findall(r"^```math\n(.*?)^```", text, re.S | re.M)
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    text = re.sub(r"(`+).+?\1", "", text, flags=re.S)
    found += re.findall(r"\$\$(.+?)\$\$", text, re.S)
    found += re.findall(r"(?<!\$)\$([^\s$][^$]*?)(?<!\s)\$(?!\d)", re.sub(r"\$\$.+?\$\$", "",
                                                                            text, flags=re.S))
    return found


SHOWN = [DOCS / p for p in shown.pages(DOCS)]


@pytest.mark.parametrize("page", SHOWN, ids=[p.name for p in SHOWN])
def test_every_formula_of_the_shown_pages_is_drawn_whole(page):
    """No formula of docs/math (nor of the derivations shown beside it) has a command this
    module does not draw, nor a control character (a string escape gone wrong: \\t of \\text)."""
    for tex in formulas(page):
        assert to_mathml(tex, display=True).unsupported == (), tex
        assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", tex), repr(tex)


def test_the_maths_pages_have_formulas():
    assert sum(len(formulas(p)) for p in SHOWN if p.parent.name == "math") >= 38
