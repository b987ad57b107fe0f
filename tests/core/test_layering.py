"""The folders follow the flow of data: imports only point down (docs/architecture.md)."""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "sheepop"

# Each folder's rank; a module may import only folders of a lower or equal rank. The modules at
# the package root (errors, files, words, threads, schedule, positional) are the floor, rank 0.
RANK = {"": 0, "config": 1, "arch": 2, "checkpoint": 3, "generation": 3, "tokenizers": 3,
        "data": 4, "model": 5, "scratch": 5, "inference": 6, "interop": 6, "train": 7,
        "progression": 8, "finetune": 8, "rl": 8, "serve": 8, "cli": 9}
FLOOR = {"", "config", "arch", "checkpoint", "generation"}  # shared by both engines, no torch
ENGINES = {"model", "scratch"}
# One place builds a model for inference (sheepop.inference); the trainer builds its own.
ENGINE_USERS = {"inference", "train"}


def package_of_file(path: Path) -> str:
    parts = path.relative_to(SRC).parts
    return parts[0] if len(parts) > 1 else ""


def package_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "sheepop":
        return None
    return parts[1] if len(parts) > 1 and (SRC / parts[1]).is_dir() else ""


def test_every_folder_has_a_rank_and_the_root_stays_small():
    folders = {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == set(RANK) - {""}
    assert len(list(SRC.glob("*.py"))) <= 10


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
    here = package_of_file(path)
    for module in imports(path):
        there = package_of(module)
        if there is None or there == here:
            continue
        assert RANK[there] <= RANK[here], f"{rel} imports {module}"
        assert {here, there} != {"model", "scratch"}, f"{rel}: the engines import each other"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(SRC)))
def test_only_the_inference_module_and_the_trainer_import_an_engine(path):
    here = package_of_file(path)
    if here in ENGINES | ENGINE_USERS:
        return
    engines = {m for m in imports(path) if package_of(m) in ENGINES}
    assert not engines, f"{path.relative_to(SRC)} imports {engines}: go through sheepop.inference"


# The rooms of sheepop.serve, ranked the same way: the API knows neither the documents nor the
# page, the documents know only the API's errors, the page builds on both.
SERVE_ROOMS = {"api": 0, "documents": 1, "page": 2}


def room_of(module: str) -> str | None:
    """The room of sheepop.serve a module is in ("sheepop.serve.api.app": "api"), "" for
    sheepop.serve itself, None outside it."""
    parts = module.split(".")
    return (parts[2] if len(parts) > 2 else "") if parts[:2] == ["sheepop", "serve"] else None


def test_serve_is_rooms_only():
    """Every module of sheepop.serve is in one of its rooms (the folder holds only its
    __init__), and every room has a rank."""
    serve = SRC / "serve"
    assert [p.name for p in serve.glob("*.py")] == ["__init__.py"]
    rooms = {p.name for p in serve.iterdir() if (p / "__init__.py").exists()}
    assert rooms == set(SERVE_ROOMS)


@pytest.mark.parametrize("path", [p for p in MODULES if p.is_relative_to(SRC / "serve")],
                         ids=lambda p: str(p.relative_to(SRC)))
def test_the_rooms_of_serve_import_only_down(path):
    here = room_of(_module_name(path))
    for module in imports(path):
        there = room_of(module)
        if there is None or there == here:
            continue
        assert there in SERVE_ROOMS, f"{path.relative_to(SRC)} imports {module}: not a room"
        assert here in SERVE_ROOMS, f"{path.relative_to(SRC)}: sheepop.serve imports a room"
        assert SERVE_ROOMS[there] <= SERVE_ROOMS[here], f"{path.relative_to(SRC)} imports {module}"


def test_the_numpy_engine_and_the_shared_core_never_import_torch():
    paths = [p for p in MODULES if package_of_file(p) in FLOOR | {"scratch"}]
    assert len(paths) > 20  # (the rule reaches the packages of the core, e.g. sheepop.arch)
    for path in paths:
        assert not {m for m in imports(path) if m.split(".")[0] == "torch"}, path


def test_no_module_is_past_400_lines():
    long = {str(p.relative_to(SRC)): n for p in MODULES
            if (n := len(p.read_text().splitlines())) > 420}
    assert not long


def _module_name(path: Path) -> str:
    parts = ("sheepop", *path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)  # a package is its __init__


def import_graph() -> dict[str, set[str]]:
    """Module -> the sheepop modules it imports, anywhere in it (inside functions too).
    `from a.b import c` points at a.b.c when that is a module, else at a.b."""
    names = {_module_name(p) for p in SRC.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for path in SRC.rglob("*.py"):
        here, targets = _module_name(path), set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in names
                            else node.module for a in node.names}
        while any(t not in names and "." in t for t in targets):  # `import a.b.name` -> a.b
            targets = {t if t in names or "." not in t else t.rpartition(".")[0] for t in targets}
        graph[here] = {t for t in targets if t in names and t != here}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None (depth-first search, three colours)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_find_cycle_reports_the_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycle_anywhere():
    graph = import_graph()
    assert "sheepop.tokenizers.bpe" in graph["sheepop.tokenizers.hf"]  # the graph sees imports
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])
