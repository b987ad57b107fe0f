"""Which documents the server shows at /docs/, and where they come from (docs/page.md, "The
mathematics, rendered").

Shown: every page of docs/math/ and docs/derivations/, the two derivations the maths pages
lean on (docs/backprop.md, docs/architectures.md), the formulas of the page's Patching view
(docs/experiments.md), and the pictures of docs/images/ those pages show. They are read from
the source checkout's docs/ when sheepop runs from one (an editable install, the tests), and
otherwise from the package's own `documents/docs/`, which building the
package fills from docs/ (setup.py's build_py, with `files` below): docs/ is the one copy in
the repository. tests/serve/test_documents_wheel.py builds a wheel and serves its pages.

This module imports nothing of sheepop's, so setup.py can load it before sheepop is installed.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[4] / "docs"
SHIPPED = Path(__file__).resolve().with_name("docs")
FOLDERS = ("math", "derivations")
PAGES = ("backprop.md", "architectures.md", "experiments.md")
_PICTURE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)")


def root() -> Path:
    """The docs/ of a source checkout when there is one, else the package's copy."""
    return SOURCE if (SOURCE / "math" / "index.md").is_file() else SHIPPED


def pages(docs: Path) -> list[str]:
    """The pages shown, as paths under `docs` ("math/04-attention.md")."""
    found = [f"{folder}/{p.name}" for folder in FOLDERS
             for p in sorted((docs / folder).glob("*.md"))]
    return found + [name for name in PAGES if (docs / name).is_file()]


def pictures(docs: Path) -> list[str]:
    """The pictures under docs/images/ that the shown pages show."""
    found = set()
    for page in pages(docs):
        for target in _PICTURE.findall((docs / page).read_text(encoding="utf-8")):
            path = posixpath.normpath(posixpath.join(posixpath.dirname(page), target))
            if path.startswith("images/") and (docs / path).is_file():
                found.add(path)
    return sorted(found)


def files(docs: Path) -> list[str]:
    """Every file shown, pages then pictures: what a built package carries."""
    return pages(docs) + pictures(docs)
