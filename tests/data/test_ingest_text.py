"""Text decoding (encodings, binary detection, rejection) and streamed normalisation."""

from __future__ import annotations

import codecs
import os
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sheepop.data.ingest import text as text_module
from sheepop.data.ingest.normalize import StreamNormalizer, normalize_text
from sheepop.data.ingest.record import Skipped
from sheepop.data.ingest.text import TextFile

FRENCH = ("Le cœur a ses raisons que la raison ne connaît point. Où est la bibliothèque ? "
          "L'été dernier, nous étions très heureux; ça coûte cher, déjà.\n") * 3
GERMAN = "Größere Übungen für Änderungen: Straße, Fußgänger und Mädchen spielten draußen.\n" * 3
RUSSIAN = "Привет, как дела? Это тестовый текст на русском языке, довольно длинный.\n" * 3
JAPANESE = "日本語のテキストです。これはテストです。東京は大きな都市です。\n" * 3


def _read(tmp_path, data: bytes) -> tuple[str, TextFile]:
    path = tmp_path / "f.txt"
    path.write_bytes(data)
    reader = TextFile(path)
    out = "".join(reader)
    reader.check()
    return out, reader


@pytest.mark.parametrize("text,encoding,found", [
    (FRENCH, "utf-8", "utf-8"),
    (RUSSIAN, "utf-8", "utf-8"),
    (FRENCH, "utf-16", "utf-16"),          # with its BOM
    (GERMAN, "utf-32", "utf-32"),
    (FRENCH, "utf-16-le", "utf-16-le"),    # no BOM: found from the NUL pattern
    (GERMAN, "utf-16-be", "utf-16-be"),
    (FRENCH, "cp1252", "cp1252"),          # detector ties with cp1250 broken towards cp1252
    (GERMAN, "latin-1", "cp1252"),         # cp1252 is a superset for these letters
    (RUSSIAN, "cp1251", "cp1251"),
    (RUSSIAN, "koi8-r", "koi8_r"),
    (JAPANESE, "shift_jis", "cp932"),
])
def test_encodings_are_found_and_decoded_exactly(tmp_path, text, encoding, found):
    out, reader = _read(tmp_path, text.encode(encoding))
    assert out == text
    assert reader.encoding == found
    assert reader.replaced == 0


def test_utf8_bom_is_stripped(tmp_path):
    out, reader = _read(tmp_path, codecs.BOM_UTF8 + FRENCH.encode())
    assert out == FRENCH and reader.encoding == "utf-8-sig"


def test_a_bom_that_lies_is_ignored(tmp_path):
    """A UTF-8 byte-order mark in front of cp1252 bytes: the bytes win, the mark is dropped."""
    out, reader = _read(tmp_path, codecs.BOM_UTF8 + FRENCH.encode("cp1252"))
    assert out == FRENCH and reader.encoding == "cp1252"


def test_nul_bytes_mean_binary(tmp_path):
    data = bytes(range(256)) * 4 + os.urandom(64)
    with pytest.raises(Skipped) as e:
        _read(tmp_path, data)
    assert e.value.code == "binary file"


def test_control_characters_mean_binary(tmp_path):
    data = b"".join(bytes([c, 65]) for c in [1, 2, 3, 4, 5, 6, 7, 8, 14, 15] * 30)
    with pytest.raises(Skipped) as e:
        _read(tmp_path, data)
    assert e.value.code == "binary file"


def test_file_that_turns_into_another_encoding_is_rejected(tmp_path, monkeypatch):
    """The sample says UTF-8, the rest is not: more than 1% replaced characters -> skipped."""
    monkeypatch.setattr(text_module, "SAMPLE_BYTES", 64)
    monkeypatch.setattr(text_module, "CHUNK_BYTES", 64)
    data = b"plain ascii text " * 20 + "é".encode("latin-1") * 30
    with pytest.raises(Skipped) as e:
        _read(tmp_path, data)
    assert e.value.code == "bad encoding"
    assert "30 of 370 characters are not valid utf-8" in e.value.detail


def test_a_few_bad_bytes_are_replaced_not_rejected(tmp_path, monkeypatch):
    monkeypatch.setattr(text_module, "SAMPLE_BYTES", 64)
    data = b"plain ascii text " * 20 + b"\xff" + b" end\n"
    out, reader = _read(tmp_path, data)
    assert out == "plain ascii text " * 20 + "\ufffd end\n"
    assert reader.replaced == 1


def test_big_file_is_decoded_in_chunks_exactly(tmp_path, monkeypatch):
    monkeypatch.setattr(text_module, "SAMPLE_BYTES", 100)
    monkeypatch.setattr(text_module, "CHUNK_BYTES", 7)  # cuts multi-byte characters
    text = FRENCH * 5
    out, reader = _read(tmp_path, text.encode("utf-16"))
    assert out == text


def test_normalize_text_nfc_and_line_endings():
    assert normalize_text("cafe\u0301\r\nline\rend\n") == "caf\u00e9\nline\nend\n"


_ALPHABET = st.sampled_from(list("ab \n\r\u0301\u0327e\u00e9\u1100\u1161\u11a8\uac00x."))


@settings(max_examples=300, deadline=None)
@given(st.text(_ALPHABET, max_size=60), st.lists(st.integers(0, 60), max_size=6),
       st.sampled_from([3, 1 << 20]))
def test_stream_normalizer_equals_whole_text_normalisation(text, cuts, max_hold):
    """Feeding any split of the text gives exactly NFC(line endings(text)); also when long
    newline-free runs force a cut before an ASCII character (max_hold=3)."""
    norm = StreamNormalizer(max_hold=max_hold)
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    out = "".join(norm.feed(text[a:b]) for a, b in zip(bounds, bounds[1:])) + norm.close()
    assert out == normalize_text(text)
    assert unicodedata.is_normalized("NFC", out) and "\r" not in out
