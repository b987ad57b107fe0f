"""Which documents the server shows at /docs/, and where they come from (docs/page.md, "The
mathematics, rendered").

Shown: every page of docs/math/ and docs/derivations/, the two derivations the maths pages
lean on (docs/backprop.md, docs/architectures.md), and the pictures of docs/images/ those pages
show. They are read from the source checkout's docs/ when sheepop runs from one, and otherwise
from the copy shipped inside the package (src/sheepop/serve/docs/, package data), since an
installed package holds no docs/. tests/serve/test_markdown.py keeps the copy equal to docs/;

    python -m sheepop.serve.documents.shown

refreshes it (it copies what is shown, and removes what is no longer).
"""

from __future__ import annotations

import filecmp
import posixpath
import re
import shutil
from pathlib import Path

from sheepop.errors import UserError

SOURCE = Path(__file__).resolve().parents[4] / "docs"
SHIPPED = Path(__file__).resolve().parents[1] / "docs"
FOLDERS = ("math", "derivations")
PAGES = ("backprop.md", "architectures.md")
REFRESH = "python -m sheepop.serve.documents.shown"
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
    """Every file shown, pages then pictures."""
    return pages(docs) + pictures(docs)


def differences(source: Path = SOURCE, shipped: Path = SHIPPED) -> list[str]:
    """The files where the package's copy is not docs/: missing, changed or left over."""
    wanted = files(source)
    have = sorted(str(p.relative_to(shipped)) for p in shipped.rglob("*") if p.is_file()) \
        if shipped.is_dir() else []
    changed = [f for f in wanted if f not in have
               or not filecmp.cmp(source / f, shipped / f, shallow=False)]
    return changed + [f for f in have if f not in wanted]


def refresh(source: Path = SOURCE, shipped: Path = SHIPPED) -> list[str]:
    """Makes the package's copy equal to docs/; returns the files it changed."""
    if not (source / "math" / "index.md").is_file():
        raise UserError(f"{source}: no docs/math/index.md: run this from a source checkout")
    changed = differences(source, shipped)
    wanted = set(files(source))
    for name in changed:
        if name in wanted:
            (shipped / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source / name, shipped / name)
        else:
            (shipped / name).unlink()
    return changed


if __name__ == "__main__":
    try:
        for name in refresh() or ["(nothing to do: the copy is docs/)"]:
            print(name)
    except UserError as e:
        raise SystemExit(f"error: {e}") from None
