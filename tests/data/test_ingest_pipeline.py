"""`prepare` end to end: a mixed folder in, shards and an exact report out."""

from __future__ import annotations

import codecs
import json
import os

import numpy as np
import pytest
from ingest_fixtures import (
    OCR_LINES,
    char_accuracy,
    make_encrypted_pdf,
    make_pdf,
    png_bytes,
    render_text,
)

from sheepop.data.ingest import PrepareOptions, pipeline, prepare, tokenizing
from sheepop.data.shards import open_prepared
from sheepop.errors import UserError
from sheepop.tokenizers import train_tokenizer

FRENCH = "L'été dernier, nous étions très heureux à la plage; ça coûte cher, déjà.\n" * 4
CODE = "def f(x):\n\treturn x  # keep   spaces\n"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus") / "in"
    (root / "notes" / "deep").mkdir(parents=True)
    (root / "notes" / "a.txt").write_bytes(b"hello world\r\nsecond line\r\n")
    (root / "notes" / "deep" / "copy.txt").write_bytes(b"hello world\nsecond line\n")  # dup
    (root / "notes" / "french.md").write_bytes(codecs.BOM_UTF8 + FRENCH.encode("cp1252"))
    (root / "notes" / "utf16.rst").write_bytes(FRENCH.encode("utf-16"))  # dup after decoding
    (root / "notes" / "empty.txt").write_bytes(b"")
    (root / "notes" / "binary.txt").write_bytes(bytes(range(256)) * 8)
    (root / "page.html").write_text("<h1>Title</h1><p>Body &amp; soul.</p>")
    (root / "m.py").write_text(CODE)
    (root / "paper.pdf").write_bytes(make_pdf([[b"PDF page one."], [b"PDF page two."]]))
    make_encrypted_pdf(root / "secret.pdf")
    (root / "broken.pdf").write_bytes(make_pdf([[b"x"]])[:150])
    (root / "scan.png").write_bytes(png_bytes(render_text(OCR_LINES)))
    (root / "song.mp3").write_bytes(b"ID3" + bytes(100))
    (root / ".secret").mkdir()
    (root / ".secret" / "key.txt").write_text("hidden")
    return root


@pytest.fixture(scope="module")
def prepared(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("out") / "data"
    lines: list[str] = []
    result = prepare(PrepareOptions(inputs=[str(corpus)], out=str(out), val_fraction=0.3,
                                    seed=7, progress=False), log=lines.append)
    return out, result, lines


def _docs(data, ids) -> list[str]:
    text = data.tokenizer.decode(np.asarray(ids).tolist())
    assert text.endswith("<|eos|>") or not text
    return text.split("<|eos|>")[:-1]


def test_every_file_has_its_status_and_reason(prepared, corpus):
    out, _, _ = prepared
    files = {os.path.relpath(f["path"], corpus): f for f in open_prepared(out).meta["files"]}
    reasons = {path: f["reason"] for path, f in files.items() if f["status"] == "skipped"}
    assert reasons == {
        ".secret": "hidden",
        "broken.pdf": reasons["broken.pdf"],
        "notes/binary.txt": "binary file: NUL bytes",
        "notes/deep/copy.txt": f"duplicate: same text as {corpus / 'notes' / 'a.txt'}",
        "notes/empty.txt": "empty file",
        "notes/utf16.rst": f"duplicate: same text as {corpus / 'notes' / 'french.md'}",
        "secret.pdf": "encrypted PDF: needs a password",
        "song.mp3": "unsupported type: .mp3",
    }
    assert reasons["broken.pdf"].startswith("corrupt PDF: ")
    used = {path: (f["type"], f.get("language"), f.get("encoding"))
            for path, f in files.items() if f["status"] == "used"}
    assert used == {"m.py": ("code", "python", "utf-8"), "notes/a.txt": ("text", None, "utf-8"),
                    "notes/french.md": ("text", None, "cp1252"),
                    "page.html": ("html", None, "utf-8"), "paper.pdf": ("pdf", None, None),
                    "scan.png": ("image", None, None)}
    assert files["notes/a.txt"]["characters"] == len("hello world\nsecond line\n")
    assert files["paper.pdf"]["pages"] == 2


def test_shards_hold_every_document_once_with_eos(prepared):
    """Each kept document exactly once, EOS after each. The char tokenizer learnt only the
    train documents, so a validation document may hold <|unk|>: expected texts are compared
    through the same tokenizer (exact for every character it knows)."""
    out, result, _ = prepared
    data = open_prepared(out)
    assert data.train.dtype == np.uint16 and data.meta["dtype"] == "uint16"
    tok = data.tokenizer
    docs = _docs(data, data.train) + _docs(data, data.val)
    assert len(docs) == 6 and len(_docs(data, data.val)) == 2  # round(6 * 0.3)
    for expected in ["hello world\nsecond line\n", FRENCH, "Title\n\nBody & soul.\n", CODE,
                     "PDF page one.\n\nPDF page two.\n"]:
        assert tok.decode(tok.encode(expected)) in docs
    assert all(tok.decode(tok.encode(d)) == d for d in _docs(data, data.train))
    ocr = next(d for d in docs if d.startswith("The"))
    assert char_accuracy(tok.decode(tok.encode("\n".join(OCR_LINES) + "\n")), ocr) >= 0.95
    meta = data.meta
    assert meta["train_tokens"] == data.train.size and meta["val_tokens"] == data.val.size
    assert sum(f["tokens"] for f in meta["files"]) == data.train.size + data.val.size
    assert meta["summary"]["documents"] == 6
    assert meta["summary"]["unknown_tokens"] == int(np.count_nonzero(data.val == tok.unk_id))
    assert meta["vocab_size"] == tok.vocab_size == result.tokenizer.vocab_size


def test_summary_table(prepared):
    _, result, lines = prepared
    table = "\n".join(lines)
    assert "total        14       6        8" in table
    assert "      2  duplicate" in table
    assert "wrote " in lines[-1] and "documents" in lines[-1]
    summary = result.summary.to_dict()
    assert summary["by_type"]["pdf"]["files"] == 3 and summary["by_type"]["pdf"]["used"] == 1
    assert summary["skipped_reasons"]["encrypted PDF"] == 1


def test_workers_do_not_change_the_output(corpus, prepared, tmp_path):
    out, _, _ = prepared
    out2 = tmp_path / "data2"
    prepare(PrepareOptions(inputs=[str(corpus)], out=str(out2), val_fraction=0.3, seed=7,
                           workers=2, progress=False))
    for name in ("train.bin", "val.bin", "tokenizer.json"):
        assert (out / name).read_bytes() == (out2 / name).read_bytes(), name
    meta1, meta2 = ((o / "meta.json").read_text() for o in (out, out2))
    assert meta1 == meta2  # byte for byte
    assert json.loads(meta1)["summary"]["documents"] == 6


def test_split_is_seeded_and_can_be_empty(corpus, tmp_path):
    def val_docs(seed, fraction, name):
        out = tmp_path / name
        prepare(PrepareOptions(inputs=[str(corpus / "notes")], out=str(out), seed=seed,
                               val_fraction=fraction, progress=False))
        data = open_prepared(out)
        return _docs(data, data.val), data
    a, _ = val_docs(1, 0.5, "a")
    b, _ = val_docs(1, 0.5, "b")
    assert a == b and len(a) == 1
    none, data = val_docs(1, 0.0, "c")
    assert none == [] and data.val.size == 0 and len(_docs(data, data.train)) == 2


def test_existing_output_refused_then_replaced_with_overwrite(corpus, tmp_path):
    out = tmp_path / "data"
    opts = PrepareOptions(inputs=[str(corpus / "m.py")], out=str(out), progress=False)
    prepare(opts)
    with pytest.raises(UserError, match="already exists .use --overwrite"):
        prepare(opts)
    opts.inputs, opts.overwrite = [str(corpus / "page.html")], True
    prepare(opts)
    data = open_prepared(out)
    assert _docs(data, data.train) == ["Title\n\nBody & soul.\n"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]  # nothing else left


def test_overwrite_never_deletes_a_folder_prepare_did_not_make(corpus, tmp_path):
    precious = tmp_path / "mine"
    precious.mkdir()
    (precious / "thesis.tex").write_text("years of work")
    with pytest.raises(UserError, match="refusing to overwrite"):
        prepare(PrepareOptions(inputs=[str(corpus / "m.py")], out=str(precious),
                               overwrite=True, progress=False))
    assert (precious / "thesis.tex").read_text() == "years of work"


def test_interrupted_run_leaves_nothing(corpus, tmp_path, monkeypatch):
    def interrupted(task):
        raise KeyboardInterrupt

    monkeypatch.setattr(tokenizing, "encode_task", interrupted)
    with pytest.raises(KeyboardInterrupt):
        prepare(PrepareOptions(inputs=[str(corpus)], out=str(tmp_path / "data"),
                               progress=False))
    assert list(tmp_path.iterdir()) == []


def test_stale_temporary_folder_of_a_dead_run_is_removed(corpus, tmp_path):
    stale = tmp_path / ".data.tmp-999999999-abc"
    stale.mkdir()
    (stale / "train.bin").write_bytes(b"half")
    prepare(PrepareOptions(inputs=[str(corpus / "m.py")], out=str(tmp_path / "data"),
                           progress=False))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]


def test_nothing_usable_is_one_clear_error(corpus, tmp_path):
    lines: list[str] = []
    with pytest.raises(UserError) as e:
        prepare(PrepareOptions(inputs=[str(corpus / "notes" / "empty.txt"),
                                        str(corpus / "secret.pdf")],
                               out=str(tmp_path / "data"), progress=False), log=lines.append)
    assert str(e.value).endswith("2 files (1 empty file, 1 encrypted PDF)")
    assert "\n" not in str(e.value) and "skipped:" in lines[0]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("bad,message", [
    ({"val_fraction": 1.0}, "--val-fraction"), ({"workers": 0}, "--workers"),
    ({"ocr_lang": "eng;rm"}, "--ocr-lang"), ({"tokenizer": "nope"}, "--tokenizer"),
    ({"inputs": ["/no/such/input"]}, "input not found"),
])
def test_bad_options(tmp_path, bad, message):
    opts = PrepareOptions(inputs=[str(tmp_path)], out=str(tmp_path / "o"), progress=False)
    for key, value in bad.items():
        setattr(opts, key, value)
    with pytest.raises(UserError, match=message):
        prepare(opts)


def test_large_document_tokenized_in_pieces_and_sampled_tokenizer(tmp_path, monkeypatch):
    """A document bigger than a task is cut after newlines; char ids are the same as one
    whole encode. The tokenizer, trained on a sample, still knows every character here."""
    monkeypatch.setattr(tokenizing, "TASK_BYTES", 100)
    text = "".join(f"line {i}: {'é' * (i % 7)}xyz\n" for i in range(200))
    (tmp_path / "big.txt").write_text(text)
    (tmp_path / "small.txt").write_text("tiny\n")
    out = tmp_path / "data"
    prepare(PrepareOptions(inputs=[str(tmp_path / "big.txt"), str(tmp_path / "small.txt")],
                           out=str(out), val_fraction=0.0, tokenizer_sample_mb=1e-3,
                           progress=False))
    data = open_prepared(out)
    tok = data.tokenizer
    assert data.train.tolist() == (tok.encode(text, add_eos=True)
                                   + tok.encode("tiny\n", add_eos=True))


def test_existing_tokenizer_file_and_uint32_vocabulary(tmp_path):
    chars = "".join(chr(c) for c in range(0x100, 0x100 + 70_000) if not 0xD800 <= c < 0xE000)
    tok = train_tokenizer("char", [chars])
    assert tok.vocab_size > 65536
    tok.save(tmp_path / "tok.json")
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "t.txt").write_text(chars[-5:] + "\n")
    out = tmp_path / "data"
    prepare(PrepareOptions(inputs=[str(tmp_path / "in")], out=str(out),
                           tokenizer=str(tmp_path / "tok.json"), progress=False))
    data = open_prepared(out)
    assert data.meta["dtype"] == "uint32" and data.train.dtype == np.uint32
    assert data.train.tolist() == tok.encode(chars[-5:] + "\n", add_eos=True)
    assert data.meta["summary"]["unknown_tokens"] == 1  # "\n" is not in that vocabulary


def test_spool_and_stores_are_not_left_in_the_output(prepared):
    out, _, _ = prepared
    assert sorted(p.name for p in out.iterdir()) == [
        "meta.json", "tokenizer.json", "train.bin", "val.bin"]
    assert pipeline.SPOOL not in os.listdir(out)
