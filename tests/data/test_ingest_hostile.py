"""Hostile inputs to ingestion (issue 13, items 8, 9, 12, 13): names that are not UTF-8, FIFOs,
a file far bigger than the cap, symbolic links out of the input folder, characters only in the
validation documents."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest

from sheepop.config.schema import DataConfig
from sheepop.data.dataset import load_dataset
from sheepop.data.ingest import PrepareOptions, prepare
from sheepop.data.ingest.collect import read_raw_text
from sheepop.data.ingest.discovery import discover
from sheepop.data.ingest.extract import ExtractOptions, close_worker, extract_file, init_worker
from sheepop.data.ingest.record import printable
from sheepop.data.shards import open_prepared

TEXT = "plain words in a plain file\n" * 4


def _prepare(inputs, out, **kw):
    lines: list[str] = []
    result = prepare(PrepareOptions(inputs=[str(p) for p in inputs], out=str(out),
                                    progress=False, **kw), log=lines.append)
    return result, "\n".join(lines), json.loads((out / "meta.json").read_bytes())


# --- item 8: a file name that is not valid UTF-8 -------------------------------------------

def test_printable_escapes_undecodable_bytes_and_controls():
    assert printable(os.fsdecode(b"caf\xe9.txt")) == "caf\\xe9.txt"
    assert printable("a\nb\x1b[0m.txt") == "a\\x0ab\\x1b[0m.txt"
    assert printable("café.txt") == "café.txt"  # valid names are left alone


def test_a_name_that_is_not_utf8_is_read_and_shown_escaped(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    with open(os.fsencode(folder) + b"/caf\xe9.txt", "wb") as f:  # latin-1 é in the name
        f.write(TEXT.encode())
    (folder / "ok.txt").write_text("another file\n")
    result, log, meta = _prepare([folder], tmp_path / "out")
    paths = [entry["path"] for entry in meta["files"]]
    assert paths == [f"{folder}/caf\\xe9.txt", f"{folder}/ok.txt"]
    assert [entry["status"] for entry in meta["files"]] == ["used", "used"]
    assert result.summary.used == 2
    (tmp_path / "out" / "meta.json").read_bytes().decode("utf-8")  # strict UTF-8 JSON


def test_prepare_command_with_such_a_name_exits_0(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    with open(os.fsencode(folder) + b"/\xff\xfe-name.txt", "wb") as f:
        f.write(TEXT.encode())
    run = subprocess.run([sys.executable, "-m", "sheepop", "prepare", str(folder), "--out",
                          str(tmp_path / "out"), "--workers", "1", "--no-progress"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr


# --- item 9: FIFOs, and a file much bigger than data.max_bytes -----------------------------

@pytest.fixture()
def with_fifo(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.txt").write_text(TEXT)
    os.mkfifo(folder / "pipe.txt")  # opening it for reading would wait for a writer forever
    return folder


def test_a_fifo_is_skipped_by_train_and_prepare(with_fifo, tmp_path):
    raw = read_raw_text(with_fifo, max_bytes=10_000)
    assert raw.texts == [TEXT] and raw.summary.reasons == {"not a regular file": 1}
    data = load_dataset(with_fifo, DataConfig(val_fraction=0.0))
    assert len(data.train) == len(TEXT) + 1
    _, _, meta = _prepare([with_fifo], tmp_path / "out")
    assert {e["path"].rsplit("/", 1)[1]: e["reason"] for e in meta["files"]} == {
        "pipe.txt": "not a regular file", "a.txt": ""}


def test_a_fifo_swapped_in_after_the_walk_is_not_opened_blocking(tmp_path):
    os.mkfifo(tmp_path / "late.txt")
    init_worker(str(tmp_path), ExtractOptions(), name="t")
    try:
        record = extract_file((str(tmp_path / "late.txt"), "late.txt"))
    finally:
        close_worker()
    assert record.reason == "not a regular file"


def test_train_stops_reading_a_big_file_at_the_cap(tmp_path):
    """16 MB of text, a 200 kB cap: only about the cap (plus one 1 MB decoding chunk) is read
    and held. Before, the whole file was extracted and then read back: a peak above 32 MB."""
    line = "une ligne de texte français, assez ordinaire, répétée encore et encore.\n"
    big = tmp_path / "big.txt"
    big.write_text(line * (16_000_000 // len(line.encode())))
    tracemalloc.start()
    try:
        raw = read_raw_text(big, max_bytes=200_000, workers=1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert raw.truncated and 200_000 - 3 <= raw.bytes_read <= 200_000  # a character not cut
    assert len(raw.texts) == 1
    assert raw.texts[0].encode() == (line * 4000).encode()[:raw.bytes_read]
    assert peak < 8_000_000, f"peak {peak / 1e6:.1f} MB"


def test_the_cap_never_cuts_a_character(tmp_path):
    (tmp_path / "e.txt").write_text("é" * 1000)  # 2 bytes each
    raw = read_raw_text(tmp_path / "e.txt", max_bytes=101)
    assert raw.texts == ["é" * 50] and raw.bytes_read == 100 and raw.truncated


# --- item 12: symbolic links leading out of the input folder ------------------------------

@pytest.fixture()
def linked(tmp_path):
    folder, outside = tmp_path / "in", tmp_path / "elsewhere"
    folder.mkdir()
    (outside / "sub").mkdir(parents=True)
    (folder / "own.txt").write_text(TEXT)
    (outside / "secret.txt").write_text("a secret that lives elsewhere\n")
    (outside / "sub" / "deep.txt").write_text("deeper secret\n")
    os.symlink(outside / "secret.txt", folder / "secret.txt")
    os.symlink(outside / "sub", folder / "linked-folder")
    os.symlink("own.txt", folder / "inside-link.txt")  # stays inside: followed (read once)
    return folder, outside


def test_links_out_of_the_inputs_are_skipped_by_default(linked):
    folder, outside = linked
    found = discover([folder])
    assert [shown for _, shown in found.tasks] == [str(folder / "inside-link.txt")]
    reasons = {os.path.basename(r.path): r.reason for r in found.skipped}
    assert reasons == {
        "linked-folder": f"link outside the inputs: to {outside / 'sub'} (--follow-links "
                         "reads it)",
        "own.txt": f"same file as: {folder / 'inside-link.txt'}",
        "secret.txt": f"link outside the inputs: to {outside / 'secret.txt'} (--follow-links "
                      "reads it)"}


def test_follow_links_reads_them_and_the_report_names_them(linked, tmp_path):
    folder, outside = linked
    result, log, meta = _prepare([folder], tmp_path / "out", follow_links=True)
    outside_of = {e["path"]: e.get("outside") for e in meta["files"] if e["status"] == "used"}
    assert outside_of == {str(folder / "inside-link.txt"): None,
                          str(folder / "linked-folder" / "deep.txt"):
                              str(outside / "sub" / "deep.txt"),
                          str(folder / "secret.txt"): str(outside / "secret.txt")}
    assert meta["summary"]["outside_files"] == 2
    assert "read through symbolic links from outside the inputs: 2 files" in log
    assert f"{folder / 'secret.txt'} -> {outside / 'secret.txt'}" in log
    raw = read_raw_text(folder, max_bytes=10_000, follow_links=True)
    assert len(raw.texts) == 3 and any("outside the inputs: 2 files" in x for x in raw.lines())


def test_an_input_named_on_the_command_line_is_read_wherever_it_leads(linked, tmp_path):
    folder, outside = linked
    found = discover([folder / "secret.txt", folder / "linked-folder"])
    assert len(found.tasks) == 2 and not found.skipped and not found.outside


def test_train_flag_sets_the_config_key(linked):
    from sheepop.cli import build_parser
    from sheepop.cli.common import flag_values

    args = build_parser().parse_args(["train", "DATA", "--follow-links"])
    assert flag_values(args)["data.follow_links"] is True
    assert "data.follow_links" not in flag_values(build_parser().parse_args(["train", "DATA"]))
    folder, _ = linked
    default = read_raw_text(folder, max_bytes=10_000)
    assert default.texts == [TEXT]
    data = load_dataset(folder, DataConfig(val_fraction=0.0, follow_links=True))
    assert "secret" in data.tokenizer.decode(data.train.tolist())


# --- item 13: the char vocabulary covers the validation documents ------------------------

def test_char_tokenizer_knows_characters_only_in_validation_documents(tmp_path):
    """Every document holds one character no other has: whichever documents the split sends
    to validation, none of their characters may become <|unk|>; a tiny tokenizer sample
    (which the char tokenizer ignores) changes nothing."""
    folder = tmp_path / "in"
    folder.mkdir()
    for i in range(20):
        (folder / f"d{i:02d}.txt").write_text(f"document {i} holds {chr(0x0410 + i)} once\n")
    for sample in (256.0, 1e-6):
        out = tmp_path / f"out-{sample}"
        result, _, meta = _prepare([folder], out, val_fraction=0.3, tokenizer_sample_mb=sample)
        data = open_prepared(out)
        assert meta["summary"]["val_documents"] == 6 and result.summary.unknown_tokens == 0
        unk = data.tokenizer.unk_id
        assert unk not in np.asarray(data.val).tolist()
        assert len(data.tokenizer.chars) == len(set("".join(
            (folder / f"d{i:02d}.txt").read_text() for i in range(20))))


def test_raw_text_char_vocabulary_covers_the_validation_tail(tmp_path):
    """`train FILE`: the validation split is the last tokens; a character only there is
    known too (the tokenizer is trained on all the text the run reads)."""
    (tmp_path / "t.txt").write_text("abc " * 200 + "Ω\n")
    data = load_dataset(tmp_path / "t.txt", DataConfig(val_fraction=0.1))
    omega = data.tokenizer.encode("Ω")
    assert omega != [data.tokenizer.unk_id] and omega[0] in np.asarray(data.val).tolist()
