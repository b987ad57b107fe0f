"""Reading docs/math/ (and docs/derivations/, docs/architectures.md and docs/finetune.md,
written the same way): the pages, their worked examples and their links.

A worked example is a fenced block whose info string is `example KIND`:

    ```example layernorm
    x = [2, 4, 6, 8]          # an input (KIND says which keys are inputs)
    mu = 5.0                  # a value the test recomputes
    ```

Each line is `key = value`, the value JSON (numbers, lists, strings, Infinity); text after a
` # ` that is not part of the JSON is a comment. A number written with decimals must agree with
the code to half a unit in its last printed place (`0.4472` means 0.44715 .. 0.44725); a number
written without decimals or exponent (`3`, `-1`) must agree exactly.
"""

from __future__ import annotations

import ast
import json
import math
import os
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
MATH = ROOT / "docs" / "math"
DERIVATIONS = ROOT / "docs" / "derivations"
MORE_PAGES = (*sorted(DERIVATIONS.glob("*.md")),  # checked like the math pages
              ROOT / "docs" / "architectures.md", ROOT / "docs" / "finetune.md")
FENCE = re.compile(r"^```example ([a-z0-9_]+)[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
LINK = re.compile(r"(!?)\[((?:[^\[\]]|\[[^\]]*\])*)\]\(([^)\s]+)\)")
CODE_NAME = re.compile(r"`([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)(?:\(\))?`")


class Num(float):
    """A number as the page prints it: its value and how many decimal places it shows."""

    places: int | None  # None: written as an integer, compared exactly

    def __new__(cls, text: str) -> Num:
        self = super().__new__(cls, float(text))
        mantissa, _, exponent = text.lower().partition("e")
        if "." not in mantissa and not exponent:
            self.places = None
        else:
            decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
            self.places = decimals - int(exponent or 0)
        return self

    def tolerance(self) -> float:
        if self.places is None:
            return 1e-9 * max(1.0, abs(self))
        return 0.5 * 10.0 ** -self.places * (1 + 1e-9) + 1e-15


@dataclass
class Example:
    page: str
    kind: str
    index: int  # 0-based among the page's examples
    values: dict[str, object] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.page}#{self.index}:{self.kind}"


def parse_value(text: str) -> object:
    return json.loads(text, parse_float=Num, parse_int=Num)


def parse_line(line: str, where: str) -> tuple[str, object]:
    key, sep, rest = line.partition("=")
    if not sep or not key.strip().isidentifier():
        raise ValueError(f"{where}: expected `key = value`, got {line!r}")
    rest = rest.strip()
    try:
        return key.strip(), parse_value(rest)
    except json.JSONDecodeError:
        pass
    cut = rest.rfind(" # ")
    while cut >= 0:  # the comment starts at some " # " outside the JSON
        try:
            return key.strip(), parse_value(rest[:cut].strip())
        except json.JSONDecodeError:
            cut = rest.rfind(" # ", 0, cut)
    raise ValueError(f"{where}: cannot read the value of {key.strip()!r}: {rest!r}")


def parse_examples(page: str, text: str) -> list[Example]:
    examples = []
    for index, m in enumerate(FENCE.finditer(text)):
        ex = Example(page, m.group(1), index)
        for n, line in enumerate(m.group(2).splitlines()):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, value = parse_line(line, f"{page} example {index} line {n + 1}")
            if key in ex.values:
                raise ValueError(f"{page} example {index}: {key!r} given twice")
            ex.values[key] = value
        examples.append(ex)
    return examples


def pages() -> list[Path]:
    return sorted(MATH.glob("*.md")) + list(MORE_PAGES)


def page_name(path: Path) -> str:
    """A page's name relative to docs/math/ ("03-positions.md", "../architectures.md"), so
    MATH / name is the page and its links resolve from its own folder."""
    return os.path.relpath(path, MATH)


@cache
def all_examples() -> list[Example]:
    out = []
    for path in pages():
        out.extend(parse_examples(page_name(path), path.read_text(encoding="utf-8")))
    return out


def plain(value: object) -> object:
    """Python numbers, strings, bools and nested lists, from NumPy or torch values."""
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def mismatches(doc: object, got: object, path: str = "") -> list[str]:
    """Where the computed value disagrees with the page (empty when they agree)."""
    got = plain(got)
    if isinstance(doc, list):
        if not isinstance(got, list) or len(got) != len(doc):
            return [f"{path}: the page shows {len(doc)} items, the code gives {got!r}"]
        out: list[str] = []
        for i, (d, g) in enumerate(zip(doc, got)):
            out.extend(mismatches(d, g, f"{path}[{i}]"))
        return out
    if isinstance(doc, Num):
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            return [f"{path}: the page shows {float(doc)}, the code gives {got!r}"]
        if math.isinf(doc) or math.isinf(got):
            return [] if doc == got else [f"{path}: page {float(doc)}, code {got}"]
        if abs(got - doc) <= doc.tolerance():
            return []
        return [f"{path}: the page shows {float(doc)!r}, the code computes {got!r}"]
    if isinstance(doc, float) and math.isinf(doc):  # Infinity parses as a plain float
        return [] if got == doc else [f"{path}: page {doc}, code {got!r}"]
    return [] if doc == got else [f"{path}: the page shows {doc!r}, the code gives {got!r}"]


# ----- links ------------------------------------------------------------------------------

@dataclass
class Link:
    page: str
    text: str
    target: str
    image: bool


def links(path: Path) -> list[Link]:
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.S | re.M)
    return [Link(page_name(path), m.group(2), m.group(3), bool(m.group(1)))
            for m in LINK.finditer(text)]


@cache
def definitions(module: Path) -> dict[str, tuple[int, int]]:
    """Every name a module defines (functions, classes, `Class.method`, module constants) and
    the lines it spans."""
    tree = ast.parse(module.read_text(encoding="utf-8"))
    names: dict[str, tuple[int, int]] = {}
    for node in tree.body:
        span = (node.lineno, node.end_lineno or node.lineno)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = span
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        names[f"{node.name}.{item.name}"] = (item.lineno, item.end_lineno)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name):
                    names[t.id] = span
    return names


def code_names(link_text: str) -> list[str]:
    """The names a link's text shows in backticks: [`linear_forward` / `linear_backward`](...)."""
    return [n for n in CODE_NAME.findall(link_text) if not n.endswith(".py")]
