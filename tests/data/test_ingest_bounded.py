"""Ingestion memory and time are bounded by limits on the decompressed line and the
decompression ratio, not by the file's size (issue 28): a huge line in a small compressed file,
a gzip of blank lines, a line nested past the JSON parser's depth, and no stray worker store
left in `prepare`'s output. The hostile files are built by streaming compressed blocks (a
repeated gzip member or zstd frame, or a compressor fed a generator): the decompressed data
is never held here."""

from __future__ import annotations

import gzip
import io
import json
import time
import tracemalloc
from collections.abc import Iterable

import pytest
import zstandard

from sheepop.data.ingest import PrepareOptions, prepare
from sheepop.data.ingest.collect import read_raw_text
from sheepop.data.ingest.jsonl import JsonLinesFile
from sheepop.data.ingest.lines import (
    MAX_LINE_BYTES,
    MAX_RATIO,
    RATIO_FLOOR_BYTES,
    BoundedLines,
    size_name,
)
from sheepop.data.ingest.record import RecordSkips

MIB = 1 << 20
GOOD = [{"text": "first good line"}, {"text": "the line after the bad one"}]


def _json_line(obj: dict) -> bytes:
    return json.dumps(obj).encode() + b"\n"


def _huge_line(n_mib: int, block: bytes = b"a" * MIB) -> Iterable[bytes]:
    """A good line, one JSON line holding n_mib MiB of 'a', another good line: as blocks."""
    yield _json_line(GOOD[0])
    yield b'{"text": "'
    for _ in range(n_mib):
        yield block
    yield b'"}\n'
    yield _json_line(GOOD[1])


def _gzip_stream(blocks: Iterable[bytes]) -> bytes:
    """One gzip member compressing `blocks` as they come (level 1: fast on repeated bytes)."""
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", compresslevel=1, mtime=0) as z:
        for block in blocks:
            z.write(block)
    return out.getvalue()


def _zstd_stream(blocks: Iterable[bytes]) -> bytes:
    compressor = zstandard.ZstdCompressor(level=3).compressobj()
    return b"".join(compressor.compress(b) for b in blocks) + compressor.flush()


def _read(path, **limits) -> tuple[list[tuple[int, str]], RecordSkips, JsonLinesFile, int]:
    """(documents, skips, reader, peak traced bytes) of reading the JSON Lines file `path`."""
    reader = JsonLinesFile(path, **limits)
    skips = RecordSkips()
    tracemalloc.start()
    try:
        docs = [(n, text[:40]) for n, text in reader.documents(skips)]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return docs, skips, reader, peak


@pytest.mark.parametrize("compress", [_gzip_stream, _zstd_stream], ids=["gzip", "zstd"])
def test_a_line_past_the_limit_is_skipped_in_bounded_pieces(tmp_path, compress):
    """A 48 MiB line with a 1 MiB limit: skipped and counted at its line number, the line
    after it kept, and the peak under 8 MiB (the 1 MiB chunk and its copies in the
    decompressor, at most 1 MiB of line).
    Before, the whole line was held (and joined, then parsed): a peak above 96 MiB."""
    path = tmp_path / "huge.jsonl.gz"
    path.write_bytes(compress(_huge_line(48)))
    docs, skips, reader, peak = _read(path, max_line_bytes=MIB, max_ratio=0)
    assert docs == [(1, GOOD[0]["text"]), (3, GOOD[1]["text"])]
    assert skips.to_meta() == {"line longer than 1 MiB": {"count": 1, "first": [2]}}
    assert reader.decompressed == sum(len(block) for block in _huge_line(48))
    assert peak < 8 * MIB, f"peak {peak / MIB:.1f} MiB"


def test_the_reader_counts_every_decompressed_byte(tmp_path):
    plain = b"".join(_huge_line(3))
    path = tmp_path / "three.jsonl.zst"
    path.write_bytes(_zstd_stream([plain]))
    docs, skips, reader, _ = _read(path, max_line_bytes=MIB)
    assert reader.decompressed == len(plain)
    assert [n for n, _ in docs] == [1, 3] and skips.counts == {"line longer than 1 MiB": 1}


def test_a_line_past_the_default_limit_in_prepare_is_reported(tmp_path):
    """With the documented limit (32 MiB): a 33 MiB line in a 40 kB zstd file is one skipped
    line in meta.json, and the good lines of the file are used."""
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "big.jsonl.zst").write_bytes(_zstd_stream(_huge_line(33)))
    prepare(PrepareOptions(inputs=[str(folder)], out=str(tmp_path / "out"), progress=False))
    meta = json.loads((tmp_path / "out" / "meta.json").read_bytes())
    [entry] = meta["files"]
    assert (entry["status"], entry["documents"]) == ("used", 2)
    assert entry["skipped_records"] == {"line longer than 32 MiB": {"count": 1, "first": [2]}}
    assert size_name(MAX_LINE_BYTES) == "32 MiB"


def test_train_reads_a_file_with_a_huge_line_in_bounded_memory(tmp_path):
    """`train FOLDER` (data.max_bytes 8 MB): a 48 MiB line costs at most the line limit
    (32 MiB) plus a few chunks, and the good lines come through. Before: a peak above 96 MiB
    (the line, then its text). The file stays under the ratio floor (64 MiB), so only the line
    limit is at work here."""
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "big.jsonl.zst").write_bytes(_zstd_stream(_huge_line(48)))
    tracemalloc.start()
    try:
        raw = read_raw_text(folder, max_bytes=8_000_000, workers=1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert raw.texts == [GOOD[0]["text"], GOOD[1]["text"]]
    assert raw.summary.record_reasons == {"line longer than 32 MiB": 1}
    assert peak < MAX_LINE_BYTES + 8 * MIB, f"peak {peak / MIB:.1f} MiB"


def _repeated_gzip(block: bytes, times: int, head: bytes = b"") -> bytes:
    """A gzip file of `head` then `block` `times` times: the same member, repeated (a gzip
    file may hold many members, read one after the other)."""
    member = gzip.compress(block, compresslevel=9, mtime=0)
    return (gzip.compress(head, mtime=0) if head else b"") + member * times


def test_a_gzip_of_blank_lines_stops_at_the_ratio_in_seconds(tmp_path):
    """A 4 MB gzip of 4 GiB of newlines after one good line: read until the ratio limit
    (200x past the first 64 MiB), the good line kept, the stop reported once, in seconds.
    Before: over 300 s, one Python step per blank line."""
    path = tmp_path / "blank.jsonl.gz"
    path.write_bytes(_repeated_gzip(b"\n" * MIB, 4096, head=_json_line(GOOD[0])))
    assert len(path.read_bytes()) < 5_000_000
    clock = time.perf_counter()
    docs, skips, reader, _ = _read(path)
    seconds = time.perf_counter() - clock
    assert docs == [(1, GOOD[0]["text"])]
    assert list(skips.counts) == [f"decompressed over {MAX_RATIO}x its size, not read further"]
    assert skips.counts[list(skips.counts)[0]] == 1
    assert RATIO_FLOOR_BYTES < reader.decompressed < 2 * RATIO_FLOOR_BYTES
    assert seconds < 10, f"{seconds:.1f} s"


def test_a_zstd_bomb_stops_the_file_with_one_reason_in_prepare(tmp_path):
    """A 60 kB zstd of one 8 GiB line (the same frame repeated) beside a good file: the bomb
    is skipped with the ratio as its one reason; the run goes on."""
    folder = tmp_path / "in"
    folder.mkdir()
    frame = zstandard.ZstdCompressor(level=19).compress(b"a" * (8 * MIB))
    head = zstandard.ZstdCompressor().compress(b'{"text": "')
    (folder / "bomb.jsonl.zst").write_bytes(head + frame * 1024)
    (folder / "ok.jsonl").write_bytes(_json_line(GOOD[0]))
    assert (folder / "bomb.jsonl.zst").stat().st_size < 300_000
    prepare(PrepareOptions(inputs=[str(folder)], out=str(tmp_path / "out"), progress=False))
    meta = json.loads((tmp_path / "out" / "meta.json").read_bytes())
    bomb, ok = meta["files"]
    assert ok["status"] == "used"
    assert bomb["status"] == "skipped"
    assert bomb["reason"] == (f"no documents: 1 line skipped: decompressed over {MAX_RATIO}x "
                              "its size, not read further: 1 (line 1)")


def test_blank_runs_are_skipped_with_their_line_numbers():
    """Lines are numbered across chunk boundaries and blank runs, as str.split would."""
    data = b"\n\n  \n" + _json_line(GOOD[0]) + b"\r\n\t\n" * 5 + b"  " + _json_line(GOOD[1])
    for chunk in (1, 3, 7, 1 << 20):
        got = list(BoundedLines(io.BytesIO(data), chunk_bytes=chunk))
        assert got == [(4, _json_line(GOOD[0])[:-1]), (15, _json_line(GOOD[1])[:-1])]


def test_a_deeply_nested_line_does_not_drop_the_lines_after_it(tmp_path):
    """Lines 2 and 4 nest 100,000 levels (past the parser's depth): each is one skipped line,
    and lines 1, 3, 5 are documents. Before: RecursionError skipped the whole file."""
    folder = tmp_path / "in"
    folder.mkdir()
    deep = b"[" * 100_000 + b"]" * 100_000
    (folder / "nested.jsonl").write_bytes(
        _json_line(GOOD[0]) + b'{"text": ' + deep + b"}\n" + _json_line(GOOD[1]) + deep
        + b"\n" + _json_line({"text": "last"}))
    prepare(PrepareOptions(inputs=[str(folder)], out=str(tmp_path / "out"), progress=False))
    [entry] = json.loads((tmp_path / "out" / "meta.json").read_bytes())["files"]
    assert (entry["status"], entry["documents"]) == ("used", 3)
    assert entry["skipped_records"] == {"nested too deeply": {"count": 2, "first": [2, 4]}}


def test_prepare_leaves_no_stray_worker_store(tmp_path):
    """Two workers, one file that gives documents: the other worker's store stayed, empty,
    in the output (17 of 37 outputs had a docs-<pid>.txt). A 64 MB file of blanks (no text,
    ~1.4 s) keeps the first worker busy, so the second one starts and takes files too."""
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a-blanks.txt").write_bytes(b" \n" * (32 << 20))
    (folder / "b.txt").write_text("one plain document\n" * 20)
    for i in range(8):
        (folder / f"c{i}.txt").write_text(" \n")
    result = prepare(PrepareOptions(inputs=[str(folder)], out=str(tmp_path / "out"),
                                    progress=False, workers=2))
    assert result.summary.used == 1
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == ["meta.json", "tokenizer.json", "train.bin", "val.bin"]


def test_plain_files_are_not_checked_for_a_ratio():
    """An uncompressed stream has no ratio: 2 MiB of blank lines with a floor of 0 read whole."""
    lines = BoundedLines(io.BytesIO(b"\n" * (2 * MIB) + b"x"), None, max_ratio=1, ratio_floor=0)
    assert list(lines) == [(2 * MIB + 1, b"x")] and lines.decompressed == 2 * MIB + 1
