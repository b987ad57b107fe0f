"""sheepop.files: atomic writes and versioned JSON documents, each failure one clear line."""

import importlib
import os
import re
import stat
from pathlib import Path

import pytest

from sheepop import files
from sheepop.errors import UserError
from sheepop.files import (
    DocumentFormat,
    atomic_open,
    atomic_write_bytes,
    atomic_write_text,
    parse_document,
    read_document,
    read_fields,
    read_json,
    read_text,
    write_document,
)

DOC = DocumentFormat("sheepop-test", 2, "sheepop test file")


def _leftovers(directory):
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def test_atomic_write_replaces_the_file_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "sub" / "a.txt"  # the directory is made
    atomic_write_text(path, "first é")
    atomic_write_bytes(path, b"second")
    assert path.read_bytes() == b"second"
    assert _leftovers(path.parent) == []


def test_a_write_that_fails_midway_keeps_the_old_content(tmp_path):
    path = tmp_path / "meta.json"
    path.write_text("old", encoding="utf-8")

    def lines():
        yield "new line 1\n"
        raise RuntimeError("the producer broke")

    with pytest.raises(RuntimeError, match="producer broke"), atomic_open(path, "w") as f:
        for line in lines():
            f.write(line)
    assert path.read_text(encoding="utf-8") == "old"
    assert _leftovers(tmp_path) == []


def test_a_failed_fsync_keeps_the_old_content(tmp_path, monkeypatch):
    path = tmp_path / "w.bin"
    path.write_bytes(b"old")

    def broken_fsync(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="No space left"):
        atomic_write_bytes(path, b"new" * 1000)
    assert path.read_bytes() == b"old"
    assert _leftovers(tmp_path) == []


def test_new_files_get_the_ordinary_umask_mode(tmp_path, monkeypatch):
    atomic_write_text(tmp_path / "a", "x")  # mkstemp alone would make it 0600
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o666 & ~files._UMASK
    monkeypatch.setattr(files, "_UMASK", 0o027)  # the module reads the umask once, at import
    atomic_write_text(tmp_path / "b", "x")
    assert stat.S_IMODE((tmp_path / "b").stat().st_mode) == 0o640  # 0666 & ~0027


def test_a_document_round_trips_with_its_format_and_version_first(tmp_path):
    write_document(tmp_path / "d.json", DOC, {"a": [1, 2], "format": "forged", "é": "ü"})
    text = (tmp_path / "d.json").read_text(encoding="utf-8")
    assert text.startswith('{\n  "format": "sheepop-test",\n  "version": 2,') and "ü" in text
    assert text.endswith("}\n")
    assert read_document(tmp_path / "d.json", DOC) == {
        "format": "sheepop-test", "version": 2, "a": [1, 2], "é": "ü"}


@pytest.mark.parametrize("content, message", [
    (b"\xff\xfe{}", "d.json: the sheepop test file is not UTF-8 text"),
    (b"{not json", "d.json is not valid JSON (Expecting property name"),
    (b"[1, 2]", 'd.json is not a sheepop test file (no "format": "sheepop-test")'),
    (b'{"format": "other", "version": 1}',
     "d.json is not a sheepop test file (its \"format\" is 'other')"),
    (b'{"format": "sheepop-test"}', "d.json: the sheepop test file has no valid version number"),
    (b'{"format": "sheepop-test", "version": "1"}', "has no valid version number"),
    (b'{"format": "sheepop-test", "version": 0}', "has no valid version number"),
    (b'{"format": "sheepop-test", "version": 3}',
     "d.json: format version 3 is newer than this sheepop reads (up to 2): upgrade sheepop"),
])
def test_each_reader_failure_is_one_line(tmp_path, content, message):
    (tmp_path / "d.json").write_bytes(content)
    with pytest.raises(UserError) as e:
        read_document(tmp_path / "d.json", DOC)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_missing_unreadable_and_directory(tmp_path):
    with pytest.raises(UserError, match=r"^no d.json here: make it with `sheepop test`$"):
        read_document(tmp_path / "d.json", DOC, "no d.json here: make it with `sheepop test`")
    with pytest.raises(UserError, match=r"^sheepop test file not found: .*d.json$"):
        read_document(tmp_path / "d.json", DOC)
    with pytest.raises(UserError, match="is a directory, not a vocab"):
        read_text(tmp_path, what="vocab")
    locked = tmp_path / "locked.json"
    locked.write_text("{}")
    # chmod 000 stops nobody running as root (as CI may), so the refusal is made to happen.
    real_open = os.open

    def refuse(path, *args, **kw):
        if Path(path) == locked:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(files.os, "open", refuse)
        with pytest.raises(UserError, match="cannot read file .*locked.json: Permission denied"):
            read_json(locked)


def test_a_hint_names_what_a_foreign_file_looks_like():
    def hint(data):
        return "; it looks like a list" if isinstance(data, list) else ""

    with pytest.raises(UserError, match=r"not a sheepop test file .*; it looks like a list$"):
        parse_document("[]", DOC, "x.json", hint=hint)
    assert parse_document('{"format": "sheepop-test", "version": 1}', DOC, "x")["version"] == 1


def test_read_fields_builds_the_object_and_a_missing_or_mistyped_field_is_one_line(tmp_path):
    write_document(tmp_path / "d.json", DOC, {"n": "x"})
    build = lambda d: int(d["n"])  # noqa: E731
    assert read_fields(tmp_path / "d.json", DOC, "no d", lambda d: d["n"]) == "x"
    for body, field in (({"n": "x"}, "invalid literal for int"), ({}, "'n'"),
                        ({"n": None}, "int() argument must be")):
        write_document(tmp_path / "d.json", DOC, body)
        with pytest.raises(UserError, match=f"^{re.escape(str(tmp_path / 'd.json'))}: missing or "
                                            f"bad field .*{re.escape(field)}") as e:
            read_fields(tmp_path / "d.json", DOC, "no d", build)
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("where, good, mistyped", [
    ("sheepop.finetune.run:FinetuneOptions",
     {"base_run": "b", "data": "d", "train_on": "assistant"}, {"beta": "x"}),
    ("sheepop.rl.run:RlOptions", {"base_run": "b", "prompts": "p", "rl": {}}, {"rl": "x"}),
    ("sheepop.progression.task:TaskOptions",
     {"digits": 3, "window_terms": 4, "reverse_digits": True, "mask_given": 2},
     {"digits": "x"}),
])
def test_a_runs_options_file_with_a_missing_or_mistyped_field_is_one_line(tmp_path, where, good,
                                                                          mistyped):
    """finetune.json, rl.json and progression.json: each run's options, read back on resume
    (a mistyped finetune.beta was a ValueError's traceback)."""
    module, _, name = where.partition(":")
    mod = importlib.import_module(module)
    options = getattr(mod, name)
    path = tmp_path / mod.RUN_FILE
    write_document(path, mod.RUN_DOCUMENT, good)
    assert options.load(tmp_path) == options(**good)
    first = next(iter(good))
    for body in ({**good, **mistyped}, {k: v for k, v in good.items() if k != first}):
        write_document(path, mod.RUN_DOCUMENT, body)
        with pytest.raises(UserError, match=f"^{re.escape(str(path))}: missing or bad field "):
            options.load(tmp_path)


def test_read_json_accepts_any_shape_of_foreign_file(tmp_path):
    (tmp_path / "vocab.json").write_text('["a", 1]', encoding="utf-8")
    assert read_json(tmp_path / "vocab.json") == ["a", 1]
