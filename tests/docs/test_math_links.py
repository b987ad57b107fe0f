"""docs/math/ holds together: every link resolves, every function a page names exists where the
link points, every picture is there, and the index lists the twelve parts in order."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from mathdoc import MATH, ROOT, all_examples, code_names, definitions, links, pages

PARTS = [p for p in pages() if re.match(r"\d\d-", p.name)]
LINKS = [link for page in pages() for link in links(page)]
LOCAL = [link for link in LINKS if not re.match(r"[a-z]+:", link.target)]
LINE_ANCHOR = re.compile(r"L(\d+)(?:-L(\d+))?")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|\$`|`\$", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(md: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", md.read_text(encoding="utf-8"), flags=re.S | re.M)
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def test_there_are_twelve_parts_and_an_index():
    assert [p.name[:2] for p in PARTS] == [f"{i:02d}" for i in range(1, 13)]
    assert (MATH / "index.md").exists()


def test_the_index_links_every_part_in_order():
    targets = [link.target for link in links(MATH / "index.md")]
    in_order = [t for t in targets if re.match(r"\d\d-.*\.md$", t)]
    firsts = list(dict.fromkeys(in_order))
    assert firsts == [p.name for p in PARTS]


def test_every_part_has_a_worked_example():
    with_examples = {ex.page for ex in all_examples()}
    assert [p.name for p in PARTS if p.name not in with_examples] == []


@pytest.mark.parametrize("link", LOCAL, ids=[f"{ln.page}:{ln.target}" for ln in LOCAL])
def test_link_resolves(link):
    path_part, _, fragment = link.target.partition("#")
    page = MATH / link.page
    target = (page.parent / path_part).resolve() if path_part else page
    assert target.exists(), f"{link.page}: [{link.text}]({link.target}) points nowhere"
    assert ROOT in target.parents, f"{link.page}: {link.target} leaves the repository"
    if link.image:
        assert target.suffix == ".png" and target.stat().st_size > 1000, link.target
    names = code_names(link.text) if target.suffix == ".py" else []
    if target.suffix == ".py":
        defined = definitions(target)
        missing = [n for n in names if n not in defined]
        assert not missing, f"{link.page}: {missing} not defined in {path_part}"
    if not fragment:
        return
    if target.suffix == ".md":
        assert fragment in anchors(target), f"{link.page}: no heading #{fragment} in {target.name}"
        return
    m = LINE_ANCHOR.fullmatch(fragment)
    assert m, f"{link.page}: anchor #{fragment} of a code file must be #L<n> or #L<n>-L<m>"
    first, last = int(m.group(1)), int(m.group(2) or m.group(1))
    n_lines = len(target.read_text(encoding="utf-8").splitlines())
    assert 1 <= first <= last <= n_lines, f"{link.page}: {link.target} is past the file's end"
    for name in names:  # a line anchor must land inside the definitions the link names
        start, end = definitions(target)[name]
        assert start <= first and last <= end, f"{link.page}: #{fragment} is not in {name}"


def test_every_code_link_names_what_it_points_to():
    """A link into src/ shows the function, class or method it means (or the module's name)."""
    vague = [f"{ln.page}: [{ln.text}]({ln.target})" for ln in LOCAL
             if ln.target.split("#")[0].endswith(".py") and "/src/" in ln.target
             and not code_names(ln.text) and not ln.text.endswith(".py")]
    assert not vague, vague


def test_every_scratch_layer_is_documented():
    """Each forward of the scratch engine is linked from some page, and each backward from
    part 9, so a layer added to the engine without its mathematics fails here."""
    scratch = ROOT / "src" / "sheepop" / "scratch"
    named: dict[str, set[str]] = {}
    for link in LOCAL:
        target = link.target.split("#")[0]
        if "/src/sheepop/scratch/" in target:
            for name in code_names(link.text):
                named.setdefault(name, set()).add(link.page)
    missing = []
    for module in sorted(scratch.glob("*.py")):
        for name in definitions(module):
            if name.endswith("_forward") and name not in named:
                missing.append(f"{module.name}: {name} is on no page")
            if name.endswith("_backward") and "09-backprop.md" not in named.get(name, ()):
                missing.append(f"{module.name}: {name} is not in 09-backprop.md")
    assert not missing, missing
