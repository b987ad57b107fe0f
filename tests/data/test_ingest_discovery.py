"""The walk: order, globs, hidden entries, symbolic links and loops, missing inputs."""

from __future__ import annotations

import os

import pytest

from sheepop.data.ingest.discovery import discover, matches
from sheepop.errors import UserError


@pytest.fixture()
def tree(tmp_path):
    root = tmp_path / "in"
    for rel in ["b.txt", "a.md", "src/z.py", "src/a.py", "src/deep/x.c", "build/out.txt",
                ".hidden.txt", ".git/config", "src/.cache/c.txt"]:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(rel)
    return root


def _shown(found, root):
    return [os.path.relpath(shown, root) for _, shown in found.tasks]


def _skips(found, root):
    return {os.path.relpath(r.path, root): r.reason for r in found.skipped}


def test_sorted_walk_skips_hidden(tree):
    found = discover([tree])
    assert _shown(found, tree) == ["a.md", "b.txt", "build/out.txt", "src/a.py", "src/z.py",
                                   "src/deep/x.c"]
    assert _skips(found, tree) == {".git": "hidden", ".hidden.txt": "hidden",
                                   "src/.cache": "hidden"}
    assert found.total_bytes == sum(len(rel) for rel in _shown(found, tree))


def test_hidden_included_on_request(tree):
    found = discover([tree], hidden=True)
    assert {".git/config", ".hidden.txt", "src/.cache/c.txt"} <= set(_shown(found, tree))
    assert found.skipped == []


def test_include_and_exclude_globs(tree):
    found = discover([tree], include=["*.py", "*.c"], exclude=["deep"])
    assert _shown(found, tree) == ["src/a.py", "src/z.py"]
    assert found.excluded == 4  # a.md, b.txt, build/out.txt, and the folder deep
    found = discover([tree], exclude=["src/*.py", "build"])
    assert _shown(found, tree) == ["a.md", "b.txt", "src/deep/x.c"]


def test_glob_matching_rules():
    assert matches("src/deep/x.c", ["*.c"])          # bare name
    assert matches("src/deep/x.c", ["src/*"])        # "*" crosses "/"
    assert not matches("src/deep/x.c", ["deep/*"])   # a path pattern is anchored
    assert not matches("x.C", ["*.c"])               # case-sensitive


def test_symlink_loop_and_second_links_read_once(tree, tmp_path):
    os.symlink("..", tree / "src" / "loop")           # back to the input root
    os.symlink("src", tree / "zagain")                # the same folder a second time
    os.symlink("b.txt", tree / "c-link.txt")          # the same file a second time
    os.link(tree / "a.md", tree / "a-hard.md")
    os.symlink("missing.txt", tree / "dangling.txt")
    found = discover([tree])
    skips = _skips(found, tree)
    assert skips["src/loop"] == f"symlink loop: leads back to {tree}"
    assert skips["zagain"] == f"folder already read: as {tree / 'src'}"
    assert skips["c-link.txt"] == f"same file as: {tree / 'b.txt'}"
    assert skips["a.md"] == f"same file as: {tree / 'a-hard.md'}"
    assert skips["dangling.txt"] == "broken symlink"
    assert _shown(found, tree) == ["a-hard.md", "b.txt", "build/out.txt", "src/a.py",
                                   "src/z.py", "src/deep/x.c"]  # each file once


def test_named_file_is_read_even_if_hidden(tree):
    found = discover([tree / ".hidden.txt", tree / "a.md"])
    assert [shown for _, shown in found.tasks] == [str(tree / ".hidden.txt"), str(tree / "a.md")]


def test_missing_input_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="input not found: .*nope"):
        discover([tmp_path / "nope"])
    os.symlink(tmp_path / "gone", tmp_path / "link")
    with pytest.raises(UserError, match="broken symbolic link"):
        discover([tmp_path / "link"])


def test_avoided_folder_is_not_entered(tree):
    found = discover([tree], avoid=[tree / "build"])
    assert "build/out.txt" not in _shown(found, tree)
