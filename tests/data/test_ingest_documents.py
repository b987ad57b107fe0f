"""Documents, not files: JSON Lines (plain, gzip, zstd) and Parquet give one document per line
or row; bad lines and null rows are counted with their numbers; `sheepop train` on a folder reads
through the same readers as `sheepop prepare`."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from sheepop.cli import main
from sheepop.config.schema import DataConfig
from sheepop.data.dataset import load_dataset
from sheepop.data.ingest import PrepareOptions, prepare
from sheepop.data.ingest.collect import read_raw_text
from sheepop.data.shards import open_prepared

# Line numbers (1-based) of each kind of bad line in LINES.
LINES = [
    json.dumps({"text": "first doc", "meta": {"body": "nested one"}}),   # 1
    "{not json",                                                       # 2
    json.dumps(["a", "list"]),                                         # 3
    json.dumps({"title": "no text here", "meta": {"body": "nested two"}}),  # 4
    json.dumps({"text": 42, "meta": {"body": 7}}),                     # 5
    "",                                                                # 6 blank: ignored
    json.dumps({"text": "second doc"}),                                # 7
    json.dumps({"text": "first doc"}),                                 # 8 duplicate of line 1
    json.dumps({"text": " \n "}),                                      # 9 whitespace only
    json.dumps({"text": "third doc", "meta": {"body": "nested three"}}),  # 10
]
JSONL = ("\n".join(LINES) + "\n").encode()


def _write_jsonl_three_ways(folder):
    folder.mkdir()
    (folder / "a.jsonl").write_bytes(JSONL)
    (folder / "b.jsonl.gz").write_bytes(gzip.compress(JSONL.replace(b" doc", b" gz doc")))
    (folder / "c.jsonl.zst").write_bytes(
        zstandard.ZstdCompressor().compress(JSONL.replace(b" doc", b" zst doc")))


def _docs(data, ids) -> list[str]:
    text = data.tokenizer.decode(np.asarray(ids).tolist())
    return text.split("<|eos|>")[:-1]


def _prepare(inputs, out, **kw):
    lines: list[str] = []
    prepare(PrepareOptions(inputs=[str(p) for p in inputs], out=str(out), val_fraction=0.0,
                           progress=False, **kw), log=lines.append)
    data = open_prepared(out)
    return data, {f["path"].rsplit("/", 1)[-1]: f for f in data.meta["files"]}, "\n".join(lines)


def test_jsonl_plain_gzip_zstd_with_bad_lines_counted_by_number(tmp_path):
    _write_jsonl_three_ways(tmp_path / "in")
    data, files, printed = _prepare([tmp_path / "in"], tmp_path / "out", tokenizer="word")
    assert _docs(data, data.train) == ["first doc", "second doc", "third doc",
                                       "first gz doc", "second gz doc", "third gz doc",
                                       "first zst doc", "second zst doc", "third zst doc"]
    expected = {"not valid JSON": {"count": 1, "first": [2]},
                "not a JSON object": {"count": 1, "first": [3]},
                "no field 'text'": {"count": 1, "first": [4]},
                "'text' not a string": {"count": 1, "first": [5]},
                "duplicate": {"count": 1, "first": [8]},
                "empty text": {"count": 1, "first": [9]}}
    for name in ("a.jsonl", "b.jsonl.gz", "c.jsonl.zst"):
        entry = files[name]
        assert entry["type"] == "jsonl" and entry["status"] == "used", entry
        assert entry["documents"] == 3 and entry["skipped_records"] == expected, entry
        assert entry["tokens"] == 3 * 2 + 3 + (3 if name != "a.jsonl" else 0)  # words + EOS
    summary = data.meta["summary"]
    assert summary["documents"] == 9 and summary["skipped_records"]["not valid JSON"] == 3
    assert summary["skipped_records"]["duplicate"] == 3
    assert ("a.jsonl: 6 lines skipped: not valid JSON: 1 (line 2); not a JSON object: 1 "
            "(line 3); no field 'text': 1 (line 4); 'text' not a string: 1 (line 5); "
            "duplicate: 1 (line 8); empty text: 1 (line 9)") in printed


def test_nested_field_and_a_file_without_the_field(tmp_path):
    _write_jsonl_three_ways(tmp_path / "in")
    data, files, _ = _prepare([tmp_path / "in" / "a.jsonl"], tmp_path / "out",
                              text_field="meta.body")
    assert _docs(data, data.train) == ["nested one", "nested two", "nested three"]
    assert files["a.jsonl"]["skipped_records"] == {
        "not valid JSON": {"count": 1, "first": [2]},
        "not a JSON object": {"count": 1, "first": [3]},
        "'meta.body' not a string": {"count": 1, "first": [5]},
        "no field 'meta.body'": {"count": 3, "first": [7, 8, 9]}}
    (tmp_path / "none.jsonl").write_text('{"a": 1}\n{"a": 2}\n')
    result = prepare(PrepareOptions(inputs=[str(tmp_path / "none.jsonl"), str(tmp_path / "in")],
                                    out=str(tmp_path / "out2"), progress=False))
    entry = next(f for f in open_prepared(result.out).meta["files"]
                 if f["path"].endswith("none.jsonl"))
    assert entry["status"] == "skipped" and entry["reason"] == (
        "no documents: 2 lines skipped: no field 'text': 2 (lines 1, 2)")


def test_corrupt_gzip_keeps_the_lines_before_the_damage(tmp_path):
    body = "".join(json.dumps({"text": f"line number {i}"}) + "\n" for i in range(2000))
    packed = gzip.compress(body.encode())
    (tmp_path / "cut.jsonl.gz").write_bytes(packed[: len(packed) // 2])
    data, files, _ = _prepare([tmp_path / "cut.jsonl.gz"], tmp_path / "out")
    entry = files["cut.jsonl.gz"]
    kept = entry["documents"]
    assert 0 < kept < 2000 and _docs(data, data.train)[-1] == f"line number {kept - 1}"
    assert entry["skipped_records"] == {
        "unreadable from here: EOFError": {"count": 1, "first": [kept + 1]}}


@pytest.fixture
def parquet_file(tmp_path):
    table = pa.table({
        "id": list(range(7)),
        "text": ["row one", None, "row three", "row four", "row five", "row six", "row seven"],
        "meta": [{"body": f"body {i}"} if i != 4 else None for i in range(7)],
    })
    path = tmp_path / "t.parquet"
    pq.write_table(table, path, row_group_size=2)
    assert pq.ParquetFile(path).num_row_groups == 4
    return path


def test_parquet_row_groups_in_order_nulls_counted(parquet_file, tmp_path):
    data, files, _ = _prepare([parquet_file], tmp_path / "out")
    assert _docs(data, data.train) == ["row one", "row three", "row four", "row five",
                                       "row six", "row seven"]
    entry = files["t.parquet"]
    assert entry["type"] == "parquet" and entry["documents"] == 6
    assert entry["skipped_records"] == {"null": {"count": 1, "first": [2]}}
    data, files, _ = _prepare([parquet_file], tmp_path / "out2", text_field="meta.body")
    assert _docs(data, data.train) == [f"body {i}" for i in (0, 1, 2, 3, 5, 6)]
    assert files["t.parquet"]["skipped_records"] == {"null": {"count": 1, "first": [5]}}


def test_parquet_missing_or_non_text_column_is_one_clear_skip(parquet_file, tmp_path):
    (tmp_path / "keep.txt").write_text("something to keep\n")
    for field, reason in (
            ("body", "no text column: no column 'body' (columns: id, text, meta)"),
            ("meta.title", "no text column: no field 'title' in 'meta' (fields: body)"),
            ("id", "not a text column: 'id' is int64, not a string")):
        _, files, printed = _prepare([parquet_file, tmp_path / "keep.txt"],
                                     tmp_path / f"out-{field}", text_field=field)
        assert files["t.parquet"]["status"] == "skipped"
        assert files["t.parquet"]["reason"] == reason
        assert files["keep.txt"]["status"] == "used" and reason in printed


def test_one_or_two_workers_write_the_same_bytes(parquet_file, tmp_path):
    _write_jsonl_three_ways(tmp_path / "in")
    (tmp_path / "in" / "notes.txt").write_text("a plain text document\n")
    parquet_file.rename(tmp_path / "in" / "t.parquet")
    outs = []
    for workers in (1, 2):
        out = tmp_path / f"out{workers}"
        prepare(PrepareOptions(inputs=[str(tmp_path / "in")], out=str(out), workers=workers,
                               val_fraction=0.3, seed=3, progress=False))
        outs.append(out)
    for name in ("train.bin", "val.bin", "tokenizer.json", "meta.json"):
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes(), name
    assert json.loads((outs[0] / "meta.json").read_text())["summary"]["documents"] == 16


def test_train_reads_a_folder_of_jsonl_and_text_like_prepare(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_bytes(JSONL)
    (tmp_path / "in" / "b.txt").write_text("plain words here\n")
    (tmp_path / "in" / "c.html").write_text("<p>html <b>text</b></p>")
    raw = read_raw_text(tmp_path / "in", max_bytes=10_000)
    assert raw.texts == ["first doc", "second doc", "third doc", "plain words here\n",
                         "html text\n"]
    assert raw.files_read == 3 and raw.bytes_read == sum(len(t) for t in raw.texts)
    data = load_dataset(tmp_path / "in", DataConfig(tokenizer="word", val_fraction=0.0))
    # 11 words + 2 line breaks (b.txt, c.html) + 5 EOS
    assert len(data.train) == 18 and len(data.val) == 0
    assert data.report[0].startswith(f"data: read 3 files, 5 documents, 0.00 MB from "
                                     f"{tmp_path / 'in'}; skipped: lines/rows: ")
    assert "1 not valid JSON" in data.report[0] and "(line 2)" in data.report[1]
    nested = load_dataset(tmp_path / "in" / "a.jsonl",
                          DataConfig(tokenizer="word", val_fraction=0.0, text_field="meta.body"))
    assert nested.tokenizer.decode(nested.train.tolist()) == \
        "nested one<|eos|>nested two<|eos|>nested three<|eos|>"


def test_train_stops_reading_at_max_bytes(tmp_path):
    body = "".join(json.dumps({"text": f"document {i:05d}"}) + "\n" for i in range(5000))
    (tmp_path / "big.jsonl").write_text(body)
    raw = read_raw_text(tmp_path / "big.jsonl", max_bytes=100)
    assert raw.texts == [f"document {i:05d}" for i in range(7)] + ["do"]  # 14 bytes each
    assert raw.bytes_read == 100 and raw.truncated
    assert raw.summary.total("characters") == 8 * 14  # the reader stopped after 8 lines


def test_text_field_option_on_both_commands(tmp_path, capsys):
    (tmp_path / "in").mkdir()
    rows = [{"body": f"the sheep number {i} eats grass. " * 4} for i in range(40)]
    (tmp_path / "in" / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["prepare", str(tmp_path / "in"), "--out", str(tmp_path / "data"),
                 "--text-field", "body", "--no-progress", "--workers", "1"]) == 0
    assert open_prepared(tmp_path / "data").meta["summary"]["documents"] == 40
    assert main(["prepare", str(tmp_path / "in"), "--out", str(tmp_path / "d2"),
                 "--text-field", "meta..x", "--no-progress"]) == 2
    assert "--text-field must be a name or a dotted path" in capsys.readouterr().err
    assert main(["train", str(tmp_path / "in"), "--out", str(tmp_path / "run"),
                 "--text-field", "body", "--steps", "1", "--no-progress",
                 "--set", "model.n_layer=1", "--set", "model.n_embd=16",
                 "--set", "model.n_head=2", "--set", "model.block_size=8",
                 "--set", "train.batch_size=2"]) == 0
    printed = capsys.readouterr().out
    assert "data: read 1 file, 40 documents" in printed
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["data"]["text_field"] == "body"


def test_digest_set_remembers_the_first_owner_through_growth():
    from sheepop.data.ingest.doctable import DigestSet
    seen = DigestSet(capacity=8)
    digests = [(-1) ** i * (i * 0x9E3779B97F4A7C15 % 2 ** 63) for i in range(1, 5001)]
    assert [seen.first_owner(d, i) for i, d in enumerate(digests)] == [-1] * 5000
    assert seen.size == 5000 and len(seen.keys) == 16384  # at most half full
    assert [seen.first_owner(d, 7) for d in digests] == list(range(5000))
    assert seen.first_owner(0, 1) == -1 and seen.first_owner(1, 2) == 1  # 0 is stored as 1
