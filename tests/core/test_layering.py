"""The folders follow the flow of data: imports only point down (docs/architecture.md)."""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "sheepop"

# Each package's rank; a module may import only packages of a lower or equal rank.
RANK = {"core": 0, "tokenizers": 1, "data": 2, "model": 3, "scratch": 3, "interop": 4,
        "train": 5, "progression": 6, "cli": 7}
CORE = {"config", "errors", "checkpoint", "schedule", "sample", "generate", "positional"}


def package_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "sheepop" or len(parts) < 2:
        return None
    return "core" if parts[1] in CORE or parts[1] == "__init__" else parts[1]


def imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


MODULES = sorted(p for p in SRC.rglob("*.py") if p.name != "__main__.py")


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(SRC)))
def test_imports_point_down_the_flow_of_data(path):
    rel = path.relative_to(SRC)
    here = "core" if len(rel.parts) == 1 else rel.parts[0]
    for module in imports(path):
        there = package_of(module)
        if there is None or there == here:
            continue
        assert RANK[there] <= RANK[here], f"{rel} imports {module}"
        assert {here, there} != {"model", "scratch"}, f"{rel}: the engines import each other"


def test_the_numpy_engine_and_the_shared_core_never_import_torch():
    for path in [*SRC.joinpath("scratch").rglob("*.py"), *(SRC / f"{m}.py" for m in CORE)]:
        assert not {m for m in imports(path) if m.split(".")[0] == "torch"}, path


def test_no_module_is_past_400_lines():
    long = {str(p.relative_to(SRC)): n for p in MODULES
            if (n := len(p.read_text().splitlines())) > 420}
    assert not long
