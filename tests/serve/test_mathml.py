"""TeX to MathML Core (sheepop.serve.documents.mathml): exact markup for each construct the maths pages
use, escaping, the commands it does not know shown and listed, and every formula of docs/math
(and docs/derivations, the derivations the maths pages link to) read without one unsupported
command."""

import re
from pathlib import Path

import pytest

from sheepop.serve.documents import shown
from sheepop.serve.documents.mathml import to_mathml

DOCS = Path(__file__).resolve().parents[2] / "docs"
ALIGN = 'columnalign="{0}" style="text-align: -webkit-{0}'


def body(tex: str, display: bool = False) -> str:
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
    (r"10^{-6} + 0.5", '<mrow><msup><mn>10</mn><mrow><mo lspace="0" rspace="0">\u2212</mo>'
                       "<mn>6</mn></mrow></msup><mo>+</mo><mn>0.5</mn></mrow>"),
    (r"a - b \ne -1", '<mrow><mi>a</mi><mo>\u2212</mo><mi>b</mi><mo>\u2260</mo>'
                      '<mo lspace="0" rspace="0">\u2212</mo><mn>1</mn></mrow>'),  # minus, sign
    (r"\frac{a}{\sqrt{d_k}}", "<mrow><mfrac><mi>a</mi><msqrt><msub><mi>d</mi><mi>k</mi></msub>"
                              "</msqrt></mfrac></mrow>"),
    (r"\tfrac12", '<mrow><mrow displaystyle="false"><mfrac><mn>1</mn><mn>2</mn></mfrac>'
                  "</mrow></mrow>"),
    (r"\sqrt[3]{x}", "<mrow><mroot><mi>x</mi><mn>3</mn></mroot></mrow>"),
    (r"\sum_{i=1}^{n} x_i", '<mrow><munderover><mo largeop="true" movablelimits="true">\u2211'
                            "</mo><mrow><mi>i</mi><mo>=</mo><mn>1</mn></mrow><mi>n</mi>"
                            "</munderover><msub><mi>x</mi><mi>i</mi></msub></mrow>"),
    (r"\Phi(\alpha) \in \mathbb{R}^{d}, \mathbf{x}",
     '<mrow><mi mathvariant="normal">\u03a6</mi><mo stretchy="false">(</mo><mi>\u03b1</mi>'
     '<mo stretchy="false">)</mo><mo>\u2208</mo><msup><mi>\u211d</mi><mi>d</mi></msup>'
     "<mo>,</mo><mi>\U0001d431</mi></mrow>"),
    (r"\text{ if } \texttt{tok\_emb}", '<mrow><mtext>\u00a0if\u00a0</mtext><mtext class="tt">'
                                       "tok_emb</mtext></mrow>"),
    (r"\operatorname{softmax}(x) = \sin x",
     '<mrow><mi>softmax</mi><mo stretchy="false">(</mo><mi>x</mi><mo stretchy="false">)</mo>'
     '<mo>=</mo><mi>sin</mi><mspace width="0.1667em"/><mi>x</mi></mrow>'),
    (r"\mathrm{lr}_\max", '<mrow><msub><mi>lr</mi><mo form="prefix" movablelimits="true" '
                          'lspace="0" rspace="0">max</mo></msub></mrow>'),
    (r"\operatorname*{argmax}_i p", '<mrow><munder><mo form="prefix" movablelimits="true" '
                                   'lspace="0" rspace="0">argmax</mo><mi>i</mi></munder>'
                                   '<mspace width="0.1667em"/><mi>p</mi></mrow>'),
    (r"\begin{equation} x \label{e} \end{equation}",
     "<mrow><mrow><mtable><mtr><mtd><mrow><mi>x</mi><mrow></mrow></mrow></mtd></mtr></mtable>"
     "</mrow></mrow>"),  # (no number, no label)
    (r"\left( a \right)", '<mrow><mrow><mo fence="true" form="prefix">(</mo><mi>a</mi>'
                          '<mo fence="true" form="postfix">)</mo></mrow></mrow>'),
    (r"\big( \lVert g \rVert \big)",
     '<mrow><mo minsize="1.2em" maxsize="1.2em" stretchy="true" symmetric="true">(</mo>'
     '<mo stretchy="false">\u2016</mo><mi>g</mi><mo stretchy="false">\u2016</mo>'
     '<mo minsize="1.2em" maxsize="1.2em" stretchy="true" symmetric="true">)</mo></mrow>'),
    (r"\hat x_i + x'_{2i}", '<mrow><msub><mover accent="true"><mi>x</mi><mo stretchy="false">^'
                            "</mo></mover><mi>i</mi></msub><mo>+</mo><msub><mrow><mi>x</mi>"
                            '<mo lspace="0" rspace="0">\u2032</mo></mrow><mrow><mn>2</mn>'
                            "<mi>i</mi></mrow></msub></mrow>"),
    (r"h \mathrel{+}= P[0{:}T]", '<mrow><mi>h</mi><mo>+=</mo><mi>P</mi><mo stretchy="false">['
                                 '</mo><mn>0</mn><mo lspace="0" rspace="0">:</mo><mi>T</mi>'
                                 '<mo stretchy="false">]</mo></mrow>'),
    (r"\underbrace{a}_{b}", '<mrow><munder><munder><mi>a</mi><mo stretchy="true">\u23df</mo>'
                            "</munder><mi>b</mi></munder></mrow>"),
    (r"\begin{pmatrix} a \\ b \end{pmatrix}",
     "<mrow><mrow><mo>(</mo><mtable><mtr><mtd><mrow><mi>a</mi></mrow></mtd></mtr><mtr><mtd>"
     "<mrow><mi>b</mi></mrow></mtd></mtr></mtable><mo>)</mo></mrow></mrow>"),
])
def test_each_construct(tex, mathml):
    assert body(tex) == mathml
    assert to_mathml(tex).unsupported == ()


def test_cases_are_a_brace_and_a_left_aligned_table():
    left = f'<mtd {ALIGN.format("left")}">'
    assert body(r"\begin{cases} 0 & j \le i \\ -\infty & j > i \end{cases}") == (
        f"<mrow><mrow><mo>{{</mo><mtable><mtr>{left}<mrow><mn>0</mn></mrow></mtd>{left}<mrow>"
        f"<mi>j</mi><mo>\u2264</mo><mi>i</mi></mrow></mtd></mtr><mtr>{left}<mrow>"
        f'<mo lspace="0" rspace="0">\u2212</mo><mi>\u221e</mi></mrow></mtd>{left}<mrow><mi>j</mi>'
        "<mo>&gt;</mo>"
        "<mi>i</mi></mrow></mtd></mtr></mtable></mrow></mrow>")


def test_aligned_pairs_its_columns_right_then_left():
    right, left = ALIGN.format("right"), ALIGN.format("left")
    assert body(r"\begin{aligned} a &= b && \text{c} \\ d &= e \\ \end{aligned}") == (
        '<mrow><mrow><mtable displaystyle="true"><mtr>'
        f'<mtd {right}; padding-right: 0"><mrow><mi>a</mi></mrow></mtd>'
        f'<mtd {left}; padding-left: 0"><mrow><mo>=</mo><mi>b</mi></mrow></mtd>'
        f'<mtd {right}; padding-right: 0; padding-left: 1.5em"><mrow></mrow></mtd>'
        f'<mtd {left}; padding-left: 0"><mrow><mtext>c</mtext></mrow></mtd></mtr><mtr>'
        f'<mtd {right}; padding-right: 0"><mrow><mi>d</mi></mrow></mtd>'
        f'<mtd {left}; padding-left: 0"><mrow><mo>=</mo><mi>e</mi></mrow></mtd></mtr>'
        "</mtable></mrow></mrow>")  # (the trailing \\ makes no empty row)


def test_lines_outside_an_environment_are_one_centred_column():
    assert body(r"a = b \\ c \\", display=True) == (
        '<mrow><mtable displaystyle="true"><mtr><mtd><mrow><mi>a</mi><mo>=</mo><mi>b</mi>'
        "</mrow></mtd></mtr><mtr><mtd><mrow><mi>c</mi></mrow></mtd></mtr></mtable></mrow>")


def test_an_unknown_command_is_shown_as_its_source_and_listed():
    formula = to_mathml(r"\foo{x} + \begin{weird} y \end{weird}")
    assert formula.unsupported == ("\\foo", "\\begin{weird}")
    assert body(r"\foo{x}") == ('<mrow><mtext><code class="tex-unsupported">\\foo</code>'
                                "</mtext><mi>x</mi></mrow>")


def test_nothing_in_a_formula_becomes_markup():
    formula = to_mathml(r'\text{<script>alert(1)</script>} \foo<img src=x> "&')
    assert "<script" not in formula.markup and "<img" not in formula.markup
    assert "&lt;script&gt;" in formula.markup and "&quot;&amp;" in formula.markup


def test_broken_input_still_gives_a_formula():
    assert body(r"\frac{a}{b") == "<mrow><mfrac><mi>a</mi><mi>b</mi></mfrac></mrow>"
    assert body("}") == '<mrow><mo stretchy="false">}</mo></mrow>'
    deep = to_mathml("{" * 5000 + "x")  # deeper than Python's stack
    assert deep.unsupported == ("(nesting too deep)",) and deep.markup.startswith("<math>")


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
