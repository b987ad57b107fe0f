"""Fixtures the ingestion tests make themselves: PDFs written by hand, images drawn with Pillow."""

from __future__ import annotations

import io
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont


def _escape(line: bytes) -> bytes:
    return line.replace(b"\\", b"\\\\").replace(b"(", b"\\(").replace(b")", b"\\)")


def make_pdf(pages: list[list[bytes]], to_unicode: dict[int, str] | None = None) -> bytes:
    """A minimal PDF 1.4: Helvetica (WinAnsi), one line per item, 14 pt apart. `to_unicode`
    maps single-byte codes to the text they stand for (e.g. 0x01 -> U+FB01, the fi ligature),
    the way typesetters encode ligature glyphs."""
    objects: list[bytes] = []

    def add(body: bytes) -> int:
        objects.append(body)
        return len(objects)

    extra = b""
    if to_unicode:
        cmap = (b"/CIDInit /ProcSet findresource begin 12 dict begin begincmap\n"
                b"/CMapName /Lig def 1 begincodespacerange <00> <FF> endcodespacerange\n"
                + b"%d beginbfchar\n" % len(to_unicode)
                + b"".join(b"<%02X> <%s>\n" % (code, text.encode("utf-16-be").hex().encode())
                           for code, text in to_unicode.items())
                + b"endbfchar endcmap CMapName currentdict /CMap defineresource pop end end\n")
        extra = b" /ToUnicode %d 0 R" % add(b"<< /Length %d >>\nstream\n%s\nendstream"
                                            % (len(cmap), cmap))
    font = add(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica "
               b"/Encoding /WinAnsiEncoding" + extra + b" >>")
    pages_id = len(objects) + 2 * len(pages) + 1
    page_ids = []
    for lines in pages:
        content = (b"BT /F1 12 Tf 14 TL 50 780 Td\n"
                   + b"".join(b"(" + _escape(line) + b") Tj T*\n" for line in lines) + b"ET")
        stream = add(b"<< /Length %d >>\nstream\n%s\nendstream" % (len(content), content))
        page_ids.append(add(
            b"<< /Type /Page /Parent %d 0 R /MediaBox [0 0 595 842] /Resources "
            b"<< /Font << /F1 %d 0 R >> >> /Contents %d 0 R >>" % (pages_id, font, stream)))
    kids = b" ".join(b"%d 0 R" % p for p in page_ids)
    assert add(b"<< /Type /Pages /Kids [%s] /Count %d >>" % (kids, len(page_ids))) == pages_id
    catalog = add(b"<< /Type /Catalog /Pages %d 0 R >>" % pages_id)
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root %d 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1, catalog, xref)
    return bytes(out)


def make_encrypted_pdf(path: Path) -> None:
    """A PDF that needs a password to open (reportlab's standard encryption)."""
    from reportlab.pdfgen import canvas

    c = canvas.Canvas(str(path), encrypt="secret")
    c.drawString(50, 780, "hidden text")
    c.showPage()
    c.save()


OCR_LINES = [
    "The quick brown fox jumps over the lazy dog.",
    "Pack my box with five dozen liquor jugs.",
    "Sphinx of black quartz, judge my vow: 1984.",
    "How vexingly quick daft zebras jump!",
]


def render_text(lines: list[str], size: int = 28) -> Image.Image:
    """Black text on white in Pillow's default (scalable) font, big enough for Tesseract."""
    font = ImageFont.load_default(size=size)
    step = int(size * 1.6)
    image = Image.new("L", (size * 30, 2 * size + step * len(lines)), 255)
    draw = ImageDraw.Draw(image)
    for i, line in enumerate(lines):
        draw.text((size, size + i * step), line, font=font, fill=0)
    return image


def png_bytes(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def char_accuracy(expected: str, got: str) -> float:
    """1 - Levenshtein distance / len(expected): the OCR character accuracy."""
    prev = list(range(len(got) + 1))
    for i, a in enumerate(expected, 1):
        cur = [i]
        for j, b in enumerate(got, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a != b)))
        prev = cur
    return 1.0 - prev[-1] / len(expected)
