"""The engines' core knows no feature that wraps it (issue 29): outside the LoRA and positions
units, no function of sheepop/scratch or sheepop/model names LoRA, adapters, digit places or
term indices. Scanned with ast: every identifier in a function's body (names, attributes,
arguments, keywords, nested definitions) and every string that is a name rather than prose
("digit_emb.weight"), split into its words; docstrings and comments are prose and not read."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "sheepop"
ENGINES = ("scratch", "model")
# The units that wrap the engines' core, and may name what they are about.
UNITS = {"scratch/lora.py", "scratch/positions.py", "model/lora.py", "model/positions.py"}
# Forbidden anywhere in a name (LoRALinear, is_adapter, digit_emb, tok_emb.new_rows) ...
PIECES = ("lora", "adapt", "digit", "new_rows", "new_tokens", "new_bias")
# ... or as a whole word of it (term_index, cfg.terms; not "determine").
WORDS = {"term", "terms", "frozen"}


def forbidden(name: str) -> bool:
    """Whether an identifier or dotted name names LoRA, adapters, digits or terms."""
    lower = name.lower()
    words = set(re.split(r"[_.]+", re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()))
    return any(piece in lower for piece in PIECES) or bool(words & WORDS)


def body_names(func: ast.AST) -> list[str]:
    """Every identifier and every name-like string constant inside `func` (its docstring
    excepted)."""
    body = getattr(func, "body", None)
    docstring = None
    if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
            and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
        docstring = body[0].value
    found = []
    for node in ast.walk(func):
        if isinstance(node, ast.Name):
            found.append(node.id)
        elif isinstance(node, ast.Attribute):
            found.append(node.attr)
        elif isinstance(node, ast.arg):
            found.append(node.arg)
        elif isinstance(node, ast.keyword) and node.arg:
            found.append(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.append(node.name)
        elif isinstance(node, ast.alias):
            found.append(node.asname or node.name)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and node is not docstring and re.fullmatch(r"[\w.]+", node.value):
            found.append(node.value)
    return found


def named_features(path: Path) -> list[str]:
    """'function: name' for each forbidden name a function (or lambda) of `path` uses."""
    hits = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            where = getattr(node, "name", f"lambda at line {node.lineno}")
            hits += [f"{where}: {name}" for name in body_names(node) if forbidden(name)]
    return hits


CORE = sorted(p for e in ENGINES for p in (SRC / e).glob("*.py")
              if str(p.relative_to(SRC)) not in UNITS)


@pytest.mark.parametrize("path", CORE, ids=lambda p: str(p.relative_to(SRC)))
def test_no_core_function_names_lora_adapters_digits_or_terms(path):
    assert named_features(path) == []


def test_the_scan_sees_what_it_forbids():
    assert all((SRC / unit).exists() for unit in UNITS)
    # The units do name their features, so a scan that saw nothing would fail here.
    assert any("lora" in hit.lower() for hit in named_features(SRC / "scratch/lora.py"))
    assert any("digit" in hit for hit in named_features(SRC / "model/positions.py"))
    assert forbidden("LoRALinear") and forbidden("tok_emb.new_rows")
    assert forbidden("cfg.term_positions") and forbidden("TermIndex")
    assert not forbidden("determine") and not forbidden("frozenset")
    snippet = ast.parse('def f(x, adapters=None):\n    """digits, in prose: allowed"""\n'
                        '    return x.digit_emb, g(lora=1), "head.new_bias", "two terms"\n')
    names = body_names(snippet.body[0])
    assert {n for n in names if forbidden(n)} == {"adapters", "digit_emb", "lora",
                                                  "head.new_bias"}
