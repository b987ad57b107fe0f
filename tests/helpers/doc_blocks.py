"""The shell blocks of the docs pages (README.md and docs/*.md), each with the mark written on
the line above its fence, in a comment the rendered page does not show:

    <!-- not run: REASON -->          tests/docs/test_docs_commands.py skips it, saying why;
    <!-- download: PACKAGE -->        it downloads PACKAGE: the test puts the tests' cached copy
                                      where the block would, and the page's later blocks run in
                                      its real_model test.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)")
MARK = re.compile(r"^<!-- (not run|download): (.+?) -->$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    text: str
    mark: str | None  # "not run", "download" or None
    why: str
    after_download: bool  # a block later on its page than the page's download block

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def page_blocks(page: Path) -> list[Block]:
    """The page's sh/bash blocks in order (a fence of another kind is stepped over whole, so a
    ```sh written inside one is not taken)."""
    lines = page.read_text().splitlines()
    found: list[Block] = []
    fence_start: tuple[int, str] | None = None
    downloaded = False
    for i, line in enumerate(lines):
        opened = FENCE.match(line)
        if fence_start is None and opened:
            fence_start = (i, opened.group(1))
            continue
        if fence_start is not None and line.startswith("```"):
            start, kind = fence_start
            fence_start = None
            if kind not in ("sh", "bash"):
                continue
            mark = MARK.match(lines[start - 1]) if start else None
            block = Block(page, start + 1, "\n".join(lines[start + 1:i]),
                          mark.group(1) if mark else None, mark.group(2) if mark else "",
                          downloaded)
            downloaded = downloaded or block.mark == "download"
            found.append(block)
    return found
