"""docs/derivations (one page per layer kind, forward and backward) is the one place the
derivations live: each page is cited by the source that computes it, each layer kind has its
page, and no Markdown page holds a control character (a string escape gone wrong: `\\b` of
`\\begin` written through a Python string is a backspace, `\\t` of `\\theta` a tab)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DERIVATIONS = ROOT / "docs" / "derivations"
PAGES = sorted(DERIVATIONS.glob("*.md"))
MARKDOWN = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]
KINDS = ("embedding", "layernorm", "rmsnorm", "attention", "positions", "mlp", "swiglu", "lora",
         "head-and-loss", "value-embeddings", "skip-connections")
OPTIMIZERS = ("muon",)  # an update rule, not a layer: its page derives the update
LOSSES = ("dpo", "policy-gradient")  # losses of the log-probabilities: forward and backward
FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.S | re.M)
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # everything but tab and newline
TAB = re.compile(r"\t")


def test_every_layer_kind_has_its_page_and_the_index_lists_them():
    assert [p.stem for p in PAGES] == sorted([*KINDS, *OPTIMIZERS, *LOSSES, "index"])
    index = (DERIVATIONS / "index.md").read_text(encoding="utf-8")
    assert [k for k in (*KINDS, *OPTIMIZERS, *LOSSES) if f"]({k}.md)" not in index] == []


def test_every_page_gives_the_forward_and_the_backward():
    for page in PAGES:
        if page.stem == "index" or page.stem in OPTIMIZERS:
            continue
        text = page.read_text(encoding="utf-8")
        headings = re.findall(r"^#{2,3} (.+)$", text, re.M)
        assert any("Forward" in h or "forward" in h for h in headings), page.name
        assert any("Backward" in h or "backward" in h or "gradient" in h for h in headings), \
            page.name
        assert "../../src/sheepop/scratch/" in text, f"{page.name} links no NumPy code"


def cited_pages() -> dict[str, list[str]]:
    """docs/derivations page -> the source files (src/) that name it."""
    cited: dict[str, list[str]] = {}
    for path in sorted((ROOT / "src").rglob("*.py")):
        for name in set(re.findall(r"docs/derivations/([a-z0-9-]+\.md)",
                                   path.read_text(encoding="utf-8"))):
            cited.setdefault(name, []).append(str(path.relative_to(ROOT)))
    return cited


def test_every_page_is_cited_by_the_source_that_computes_it():
    cited = cited_pages()
    assert [p.name for p in PAGES if p.name not in cited] == []
    # and a citation names a page that exists
    assert sorted(set(cited) - {p.name for p in PAGES}) == []


def outside_code(text: str) -> str:
    return FENCE.sub("", text)


@pytest.mark.parametrize("page", MARKDOWN, ids=[str(p.relative_to(ROOT)) for p in MARKDOWN])
def test_no_control_character(page):
    """No control character but the newline; a tab only inside a fenced code block (a Makefile
    or a program shown as it is), never in prose or a formula."""
    text = page.read_text(encoding="utf-8")
    bad = [(text.count("\n", 0, m.start()) + 1, repr(m.group())) for m in CONTROL.finditer(text)]
    assert bad == [], f"{page.name}: control characters at (line, char) {bad[:5]}"
    prose = outside_code(text)
    assert not TAB.search(prose), \
        f"{page.name}: a tab outside a code block (a \\t of LaTeX eaten by a string escape?)"


def test_the_control_character_check_catches_an_escaped_formula():
    broken = "$$R = \\begin{pmatrix} \\cos\\theta \\end{pmatrix}$$".replace("\\b", "\b") \
        .replace("\\t", "\t")
    assert CONTROL.search(broken) and TAB.search(outside_code(broken))
    assert not TAB.search(outside_code("```make\nall:\n\tpython x.py\n```\n"))


def test_an_optimizer_page_derives_its_update_and_links_both_engines():
    for stem in OPTIMIZERS:
        text = (DERIVATIONS / f"{stem}.md").read_text(encoding="utf-8")
        headings = re.findall(r"^#{2,3} (.+)$", text, re.M)
        assert "The update" in headings, stem
        assert "../../src/sheepop/scratch/" in text and "../../src/sheepop/train/" in text, stem
