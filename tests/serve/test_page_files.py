"""What the page sends a user's browser holds no notes for the project's developers (issue 41,
section 4: index.html carried "<!-- issue 30: ... -->"): no HTML comment in the page, and no
issue number in any file served under /static/."""

from __future__ import annotations

import re

from sheepop.serve.page.routes import STATIC


def test_the_page_carries_no_html_comment():
    assert "<!--" not in (STATIC / "index.html").read_text(encoding="utf-8")


def test_no_file_served_names_an_issue():
    named = {path.name: re.findall(r"(?i)\bissues? \d+", path.read_text(encoding="utf-8"))
             for path in STATIC.iterdir() if path.is_file()}
    assert {name: found for name, found in named.items() if found} == {}
