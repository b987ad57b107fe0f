"""Every name the docs' prose gives the code exists, where the prose says it is.

test_math_links.py checks the links of docs/math/ and the pages written like it; this file reads
every page (docs/**/*.md and README.md, fenced blocks left out) for the names written in
backticks and checks each against the code:

- a module path `sheepop.a.b.name` imports, and `name` is an attribute of it;
- a file `folder/module.py` is in the repository (under the root, src/, src/sheepop/ or tests/);
- a call `name()` is defined in the repository (or is Python's, or a library's listed below), and
  `Owner.name()` is an attribute of `Owner` when `Owner` is one of sheepop's modules or classes;
- a setting `section.key` (`model.norm`, `--set lora.rank=8`, `[lora]` `rank`) is a field of the
  config schema's section, and a sentence that links a config module for a `[section]` links the
  one that defines it;
- a code link's names (`[name](path.py)`), a file followed by a name (`model/lm.py` `TorchLM`)
  and "`f`, which calls `g`" hold: g is called in f's body;

and three things the prose counts: the tokenizer kinds, the files "adding a norm kind" touches,
and the test folders.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import re
from functools import cache
from pathlib import Path

import pytest
from mathdoc import ROOT, code_names, definitions, links, pages

from sheepop.config.schema import SECTIONS, TOKENIZER_KINDS

SRC = ROOT / "src" / "sheepop"
DOCS = [p for p in sorted((ROOT / "docs").rglob("*.md"))] + [ROOT / "README.md"]
FENCED = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.S | re.M)
TICKED = re.compile(r"`([^`\n]+)`")
FILE_SUFFIXES = {"json", "jsonl", "png", "bin", "txt", "safetensors", "lock", "yaml", "md",
                 "py", "gguf", "toml", "html", "csv", "parquet", "zst", "gz"}
# Names of Python's or a library's that the docs call, and files of another project, with whose
# they are.
FOREIGN_CALLS = {"accept": "socket.accept", "isdigit": "str.isdigit", "no_sync": "torch DDP"}
FOREIGN_FILES = {"config/train_shakespeare_char.py": "nanoGPT's"}
NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
           "eight": 8, "nine": 9, "ten": 10}


def prose(page: Path) -> str:
    return FENCED.sub("", page.read_text(encoding="utf-8"))


def ticked(page: Path) -> list[str]:
    return TICKED.findall(prose(page))


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


@cache
def resolves(dotted: str) -> bool:
    """`sheepop.a.b` is a module, or an attribute chain of the longest module prefix."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def file_exists(path: str) -> bool:
    return any((base / path).exists() for base in (ROOT, ROOT / "src", SRC, ROOT / "tests"))


@cache
def defined_anywhere() -> frozenset[str]:
    """Every function, method and class name defined in the repository's Python."""
    names: set[str] = set()
    for folder in ("src", "tests", "benchmarks", "docs"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    names.add(node.name)
    return frozenset(names)


@cache
def sheepop_owner(name: str) -> object | None:
    """The sheepop module or class a prose name `name` stands for (`threads`, `Config`)."""
    modules = {".".join(p.relative_to(SRC.parent).with_suffix("").parts)
               for p in SRC.rglob("*.py") if p.stem != "__init__"}
    found = sorted(m for m in modules if m.split(".")[-1] == name)
    if len(found) == 1:
        return importlib.import_module(found[0])
    for module in sorted(modules):
        if name in definitions(ROOT / "src" / (module.replace(".", "/") + ".py")):
            return getattr(importlib.import_module(module), name)
    return None


def names_in_docs(kind: re.Pattern[str]) -> list[tuple[str, str]]:
    return sorted({(page_id(p), m.group(0)) for p in DOCS for t in ticked(p)
                   for m in [kind.fullmatch(t)] if m})


MODULE_PATHS = names_in_docs(re.compile(r"sheepop(\.\w+)+"))
FILES = names_in_docs(re.compile(r"[\w.-]+(/[\w.-]+)+\.py"))
CALLS = names_in_docs(re.compile(r"(\w+\.)*\w+\(\)"))


@pytest.mark.parametrize("page,name", MODULE_PATHS, ids=[f"{p}:{n}" for p, n in MODULE_PATHS])
def test_a_module_path_the_docs_name_imports(page, name):
    assert resolves(name), f"{page}: `{name}` is no module or attribute of sheepop"


@pytest.mark.parametrize("page,path", FILES, ids=[f"{p}:{n}" for p, n in FILES])
def test_a_file_the_docs_name_is_there(page, path):
    assert file_exists(path) or path in FOREIGN_FILES, f"{page}: `{path}` is not in the repository"


@pytest.mark.parametrize("page,call", CALLS, ids=[f"{p}:{n}" for p, n in CALLS])
def test_a_call_the_docs_name_is_defined(page, call):
    *owner, name = call[:-2].split(".")
    if not owner:
        assert name in defined_anywhere() or hasattr(builtins, name) or name in FOREIGN_CALLS, \
            f"{page}: `{call}` is defined nowhere"
        return
    thing = sheepop_owner(owner[-1]) if len(owner) == 1 else None
    if thing is not None:  # a name that is not sheepop's (torch.compile, gc.collect) is skipped
        assert hasattr(thing, name), f"{page}: `{call}`: {owner[-1]} has no {name}"


# ----- settings -------------------------------------------------------------------------------

def settings_named(page: Path) -> list[str]:
    """`section.key` as written alone, inside `--set section.key=value`, or as `[section]` `key`."""
    text = prose(page)
    found = []
    for t in TICKED.findall(text):
        m = re.fullmatch(r"(?:--set )?(\w+)\.(\w+)(?:=\S*)?", t)
        if m and m.group(1) in SECTIONS and m.group(2) not in FILE_SUFFIXES:
            found.append(f"{m.group(1)}.{m.group(2)}")
    for m in re.finditer(r"`\[(\w+)\]` `(\w+)`", text):
        if m.group(1) in SECTIONS:
            found.append(f"{m.group(1)}.{m.group(2)}")
    return found


SETTINGS = sorted({(page_id(p), s) for p in DOCS for s in settings_named(p)})


@pytest.mark.parametrize("page,setting", SETTINGS, ids=[f"{p}:{s}" for p, s in SETTINGS])
def test_a_setting_the_docs_name_is_in_the_schema(page, setting):
    section, key = setting.split(".")
    known = hasattr(SECTIONS[section], key) or resolves(f"sheepop.{section}.{key}")
    assert known, f"{page}: `{setting}` is no setting of [{section}] (nor a sheepop module)"


def sentences(page: Path) -> list[str]:
    return re.split(r"(?<=[.!?])\s+(?=[A-Z`\[*(])|\n\s*\n", prose(page))


SECTION_HOMES = sorted({(page_id(p), m.group(1), section) for p in DOCS for s in sentences(p)
                        for m in re.finditer(r"\]\((?:\.\./)+src/sheepop/config/(\w+)\.py\)", s)
                        for section in re.findall(r"`\[(\w+)\]`", s) if section in SECTIONS})


@pytest.mark.parametrize("page,module,section", SECTION_HOMES,
                         ids=[f"{p}:{m}:{s}" for p, m, s in SECTION_HOMES])
def test_a_section_is_linked_to_the_module_that_defines_it(page, module, section):
    home = SECTIONS[section].__module__
    assert home == f"sheepop.config.{module}", \
        f"{page}: `[{section}]` is linked to config/{module}.py; it is defined in {home}"


# ----- names said to be in a file, and what a function calls -------------------------------------

def module_names(path: Path) -> set[str]:
    """The names `path` defines, methods also by their own name (`Tokenizer.encode`, `encode`)."""
    names = set(definitions(path))
    return names | {n.split(".", 1)[1] for n in names if "." in n}


def source(path: str) -> Path | None:
    for base in (SRC, ROOT / "src", ROOT):
        if (base / path).is_file():
            return base / path
    return None


def placed_names() -> list[tuple[str, str, str]]:
    """(page, file, name) for every code link's names and every "`file.py` `Name`" pair."""
    out = []
    math_pages = set(pages())
    for page in DOCS:
        if page not in math_pages:  # (test_math_links.py checks those pages' links)
            for link in links(page):
                target = link.target.split("#")[0]
                if target.endswith(".py") and "/src/" in target:
                    path = (page.parent / target).resolve()
                    out += [(page_id(page), str(path.relative_to(ROOT)), name)
                            for name in code_names(link.text)]
        for m in re.finditer(r"`([\w/]+\.py)`,? \(?`(\w+)`", prose(page)):
            if (path := source(m.group(1))) is not None:
                out.append((page_id(page), str(path.relative_to(ROOT)), m.group(2)))
    return sorted(set(out))


PLACED = placed_names()


@pytest.mark.parametrize("page,path,name", PLACED, ids=[f"{p}:{f}:{n}" for p, f, n in PLACED])
def test_a_name_is_defined_in_the_file_the_docs_put_it_in(page, path, name):
    target = ROOT / path
    assert target.exists(), f"{page}: {path} does not exist"
    module = ".".join(target.relative_to(ROOT / "src").with_suffix("").parts)
    parts = name.split(".")  # the module's own name leads a dotted one: `commit.commit_files`
    for cut in range(len(parts), 0, -1):
        if f".{module}".endswith("." + ".".join(parts[:cut])):
            parts = parts[cut:]
            break
    assert not parts or ".".join(parts) in module_names(target), \
        f"{page}: `{name}` is not defined in {path}"


def calls_in(path: Path, function: str) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    node = next(n for n in tree.body if getattr(n, "name", None) == function)
    return {c.func.id if isinstance(c.func, ast.Name) else c.func.attr
            for c in ast.walk(node) if isinstance(c, ast.Call)
            and isinstance(c.func, (ast.Name, ast.Attribute))}


CALLS_SAID = sorted({(page_id(p), m.group(2), m.group(1), callee)
                     for p in DOCS for s in sentences(p)
                     for m in re.finditer(r"\[`(\w+)`\]\(([^)#]+\.py)\),? which calls(.*)", s, re.S)
                     for callee in re.findall(r"\[`(\w+)`\]", m.group(3))})


@pytest.mark.parametrize("page,path,caller,callee", CALLS_SAID,
                         ids=[f"{p}:{a}->{b}" for p, _, a, b in CALLS_SAID])
def test_a_function_calls_what_the_docs_say(page, path, caller, callee):
    target = (ROOT / page).parent / path
    assert callee in calls_in(target, caller), f"{page}: `{caller}` does not call `{callee}`"


# ----- what the prose counts ------------------------------------------------------------------

def test_the_pages_count_the_tokenizer_kinds():
    said = [(page_id(p), m.group(1)) for p in DOCS
            for m in re.finditer(r"sheepop has (\w+) kinds", prose(p))]
    assert said, "no page counts the tokenizer kinds"
    wrong = [(p, n) for p, n in said if NUMBERS.get(n.lower()) != len(TOKENIZER_KINDS)]
    assert not wrong, f"{wrong}: there are {len(TOKENIZER_KINDS)} ({', '.join(TOKENIZER_KINDS)})"


def norm_kind_places() -> set[str]:
    """The source files that hold one entry per norm kind (a dict keyed by every kind) or branch
    on one (`if kind == "layernorm"`): where a new kind must be written."""
    kinds = set(importlib.import_module("sheepop.config.layer_kinds").NORM_VECTORS)
    places = set()
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            keys = {getattr(k, "value", None) for k in getattr(node, "keys", ())}
            if isinstance(node, ast.Dict) and keys == kinds:
                places.add(str(path.relative_to(ROOT)))
            if isinstance(node, (ast.If, ast.IfExp)) and isinstance(node.test, ast.Compare) \
                    and any(getattr(c, "value", None) in kinds for c in node.test.comparators):
                places.add(str(path.relative_to(ROOT)))
    return places


def test_adding_a_norm_kind_lists_every_file_that_knows_the_kinds():
    text = prose(ROOT / "docs" / "architecture.md")
    steps = text.split("**Adding a norm kind**", 1)[1].split("\n\n", 2)[1]
    listed = set(re.findall(r"^\d+\. `(src/[\w/]+\.py)`", steps, re.M))
    assert listed == norm_kind_places()


def test_the_tests_section_names_every_test_folder():
    text = prose(ROOT / "docs" / "architecture.md").split("## Tests", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`(\w+)/`", text))
    folders = {p.name for p in (ROOT / "tests").iterdir()
               if p.is_dir() and not p.name.startswith((".", "__"))}
    assert named >= folders, f"not in docs/architecture.md's Tests: {sorted(folders - named)}"
    packages = {p.name for p in SRC.iterdir() if (p / "__init__.py").exists()}
    unplaced = [p for p in sorted(packages - folders) if f"sheepop.{p}" not in text]
    assert not unplaced, f"docs/architecture.md's Tests: where are the tests of {unplaced}?"
