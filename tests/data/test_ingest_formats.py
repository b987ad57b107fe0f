"""One extractor per format: HTML, code, PDF, images (OCR), and the file-type decision."""

from __future__ import annotations

import shutil

import pytest
from ingest_fixtures import (
    OCR_LINES,
    char_accuracy,
    make_encrypted_pdf,
    make_pdf,
    png_bytes,
    render_text,
)
from PIL import Image

from sheepop.data.ingest import extract, image
from sheepop.data.ingest.extract import ExtractOptions, extract_file
from sheepop.data.ingest.filetypes import classify
from sheepop.data.ingest.html import html_to_text
from sheepop.data.ingest.pdf import fix_ligatures, join_hyphenated
from sheepop.data.ingest.store import read_document

PAGE = """<!DOCTYPE html><html><head><title>T</title><style>p{x:1}</style>
<script>var a = "<p>not text</p>";</script></head>
<body><h1>Hello   <b>world</b></h1>
<p>First   paragraph
 with &amp; entities &#233; and a<br>break.</p>
<ul><li>one</li><li> two </li></ul>
<pre>  code
    indented</pre>
<table><tr><td>a</td><td>b</td></tr><tr><td>c</td><td>d</td></tr></table>
<div>tail</div><!-- a comment --></body></html>"""
PAGE_TEXT = ("Hello world\n\nFirst paragraph with & entities é and a\nbreak.\n\none\ntwo\n\n"
             "  code\n    indented\n\na b\nc d\n\ntail\n")


def test_html_to_text_exact():
    assert "".join(html_to_text([PAGE])) == PAGE_TEXT


def test_html_to_text_same_when_fed_in_small_pieces():
    assert "".join(html_to_text(PAGE[i:i + 5] for i in range(0, len(PAGE), 5))) == PAGE_TEXT


@pytest.mark.parametrize("name,head,expected", [
    ("notes.txt", b"\x89PNG\r\n\x1a\n" + bytes(20), ("image", None)),  # magic beats the name
    ("paper.bin", b"%PDF-1.4\n", ("pdf", None)),
    ("scan.JPG", b"", ("image", None)),
    ("x.pdf", b"garbage", ("pdf", None)),       # the PDF reader will say what is wrong
    ("Makefile", b"all:\n", ("code", "make")),
    ("run", b"#!/usr/bin/env python3.11\nprint(1)\n", ("code", "python")),
    ("tool", b"#!/bin/bash\necho\n", ("code", "shell")),
    ("lib.rs", b"fn main() {}", ("code", "rust")),
    ("README", b"Read me.\n", ("text", None)),
    ("notes.md", b"# Title\n", ("text", None)),
    ("page.HTM", b"<p>x</p>", ("html", None)),
    ("data.xyz", b"abc", ("other", None)),
    ("archive.txt", b"PK\x03\x04" + bytes(30), ("other", None)),  # a zip named .txt
])
def test_classify(name, head, expected):
    assert classify(name, head) == expected


@pytest.fixture()
def worker(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    extract.init_worker(str(store), ExtractOptions(), name="test")
    yield store / "docs-test.txt"
    extract.close_worker()


def _extract(path):
    record = extract_file((str(path), str(path)))
    text = None
    if record.status == "used":
        text = read_document(record.store and path.parent / "store" / record.store,
                             record.docs.offset[0], record.docs.nbytes[0])
    return record, text


def test_code_keeps_exact_whitespace_and_language(tmp_path, worker):
    source = "def f(x):\r\n\tif x:  \r\n\t\treturn [x,\r\n        x]\r\n\n\n"
    path = tmp_path / "m.py"
    path.write_bytes(source.encode())
    record, text = _extract(path)
    assert (record.type, record.language, record.status) == ("code", "python", "used")
    assert text == source.replace("\r\n", "\n")


def test_ligatures_only_are_nfkc_normalised():
    assert fix_ligatures("\ufb01ne \ufb02ow \ufb03x \ufb00 x\u00b2 \uff21") == \
        "fine flow ffix ff x\u00b2 \uff21"  # superscript two and full-width A untouched


def test_hyphenation_joined():
    assert join_hyphenated("inter\ufffenational well\ufffe\r\nknown") == \
        "international wellknown"
    assert join_hyphenated("a long hyphen-\nated word, Jean-\nPaul, 1990-\n2000") == \
        "a long hyphenated word, Jean-\nPaul, 1990-\n2000"


def test_pdf_text_page_by_page(tmp_path, worker):
    pdf = make_pdf([[b"The \x01rst \x02ow of inter-", b"national trade is well-",
                     b"known. Caf\xe9 na\xefve."],
                    [b"Second page, line one", b"line two."]],
                   to_unicode={1: "\ufb01", 2: "\ufb02"})
    path = tmp_path / "paper.pdf"
    path.write_bytes(pdf)
    record, text = _extract(path)
    assert (record.type, record.status, record.pages) == ("pdf", "used", 2)
    assert text == ("The first flow of international trade is wellknown. Café naïve.\n\n"
                    "Second page, line one\nline two.\n")


def test_encrypted_corrupt_and_fake_pdfs_are_skipped(tmp_path, worker):
    make_encrypted_pdf(tmp_path / "secret.pdf")
    good = make_pdf([[b"some text"]])
    (tmp_path / "cut.pdf").write_bytes(good[:200])
    (tmp_path / "fake.pdf").write_bytes(b"this is not a pdf at all")
    reasons = {name: _extract(tmp_path / name)[0].reason
               for name in ("secret.pdf", "cut.pdf", "fake.pdf")}
    assert reasons["secret.pdf"] == "encrypted PDF: needs a password"
    assert reasons["cut.pdf"].startswith("corrupt PDF: ")
    assert reasons["fake.pdf"].startswith("corrupt PDF: ")
    assert worker.stat().st_size == 0  # nothing was left in the store


def test_ocr_reaches_95_percent_character_accuracy(tmp_path, worker):
    path = tmp_path / "scan.png"
    path.write_bytes(png_bytes(render_text(OCR_LINES)))
    record, text = _extract(path)
    assert (record.type, record.status, record.pages) == ("image", "used", 1)
    expected = "\n".join(OCR_LINES) + "\n"
    accuracy = char_accuracy(expected, text)
    assert accuracy >= 0.95, (accuracy, text)


def test_ocr_reads_every_frame_of_a_tiff(tmp_path, worker):
    frames = [render_text(OCR_LINES[:1]), render_text(OCR_LINES[1:2])]
    path = tmp_path / "two.tiff"
    frames[0].save(path, save_all=True, append_images=frames[1:])
    record, text = _extract(path)
    assert record.pages == 2
    pages = text.split("\n\n")
    assert len(pages) == 2
    assert char_accuracy(OCR_LINES[0], pages[0]) >= 0.95
    assert char_accuracy(OCR_LINES[1] + "\n", pages[1]) >= 0.95


def test_truncated_and_fake_images_are_skipped(tmp_path, worker):
    data = png_bytes(render_text(OCR_LINES[:1]))
    (tmp_path / "cut.png").write_bytes(data[: len(data) // 2])
    (tmp_path / "fake.jpg").write_bytes(b"not an image, only words")
    cut, _ = _extract(tmp_path / "cut.png")
    fake, _ = _extract(tmp_path / "fake.jpg")
    assert cut.reason.startswith("corrupt image: ")
    assert fake.reason == "corrupt image: not an image Pillow can read"


def test_missing_tesseract_gives_an_install_hint(tmp_path, worker, monkeypatch):
    monkeypatch.setattr(image.pytesseract.pytesseract, "tesseract_cmd", "/nonexistent/tess")
    image.tesseract_problem.cache_clear()
    try:
        path = tmp_path / "scan.png"
        Image.new("L", (40, 40), 255).save(path)
        record, _ = _extract(path)
    finally:
        image.tesseract_problem.cache_clear()
    assert record.reason == ("OCR unavailable: Tesseract is not installed "
                             "(apt-get install tesseract-ocr tesseract-ocr-eng)")


def test_missing_ocr_language_names_its_package():
    assert shutil.which("tesseract")
    assert image.tesseract_problem("eng+xyz") == (
        "Tesseract has no language data for xyz (apt-get install tesseract-ocr-xyz)")
    assert image.tesseract_problem("eng") is None


def test_zero_byte_unreadable_and_whitespace_files(tmp_path, worker, monkeypatch):
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "blank.txt").write_bytes(b" \n\t\r\n")
    (tmp_path / "locked.txt").write_bytes(b"secret")
    real_open = open

    def deny(path, *args, **kwargs):
        if str(path).endswith("locked.txt"):
            raise PermissionError(13, "Permission denied")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", deny)
    assert _extract(tmp_path / "empty.txt")[0].reason == "empty file"
    assert _extract(tmp_path / "blank.txt")[0].reason == "no text"
    assert _extract(tmp_path / "locked.txt")[0].reason == "unreadable: Permission denied"
