"""Images -> text by OCR: Pillow reads the image, Tesseract (through pytesseract) reads the text.

Tesseract is a program (Debian: `tesseract-ocr` plus one `tesseract-ocr-LANG` package per
language), not a Python package, so it is looked for once per process; when it or the asked-for
language data is missing, images are skipped with a reason that says what to install.
OMP_THREAD_LIMIT=1 is set for it: its OpenMP threading makes a page 5x slower on a small
machine (FIELD-NOTES: 3.7 s/page instead of 18-20 s), and the pipeline already runs one OCR
per worker process. Every frame of a multi-page TIFF or GIF is read.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path

import pytesseract
from PIL import Image, ImageSequence, UnidentifiedImageError

from sheepop.data.ingest.record import Skipped

OCR_TIMEOUT_S = 600
INSTALL_HINT = "apt-get install tesseract-ocr tesseract-ocr-eng"


@lru_cache(maxsize=8)
def tesseract_problem(lang: str) -> str | None:
    """None when Tesseract can read `lang` ("eng", "eng+fra"), else what is wrong."""
    try:
        pytesseract.get_tesseract_version()
        have = set(pytesseract.get_languages(config=""))
    except (pytesseract.TesseractNotFoundError, OSError):
        return f"Tesseract is not installed ({INSTALL_HINT})"
    except pytesseract.TesseractError as e:
        return f"Tesseract does not run: {e}"
    missing = [code for code in lang.split("+") if code not in have]
    if missing:
        packages = " ".join(f"tesseract-ocr-{code}" for code in missing)
        return (f"Tesseract has no language data for {', '.join(missing)} "
                f"(apt-get install {packages})")
    return None


def _grey(frame: Image.Image) -> Image.Image:
    """Greyscale on white: a transparent background would otherwise read as black."""
    if frame.mode in ("RGBA", "LA", "PA") or "transparency" in frame.info:
        rgba = frame.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("L")
    return frame.convert("L")


class ImageFile:
    """Iterate the OCR text of each frame of an image; `pages` counts the frames read."""

    def __init__(self, path: str | Path, lang: str = "eng") -> None:
        self.path = Path(path)
        self.lang = lang
        self.pages = 0

    def __iter__(self) -> Iterator[str]:
        problem = tesseract_problem(self.lang)
        if problem:
            raise Skipped("OCR unavailable", problem)
        os.environ.setdefault("OMP_THREAD_LIMIT", "1")
        try:
            image = Image.open(self.path)
        except UnidentifiedImageError:
            raise Skipped("corrupt image", "not an image Pillow can read") from None
        except Image.DecompressionBombError as e:
            raise Skipped("image too large", str(e)) from None
        with image:
            for frame in ImageSequence.Iterator(image):
                try:
                    grey = _grey(frame)
                except OSError as e:  # "image file is truncated", bad compressed data
                    raise Skipped("corrupt image", str(e)) from None
                yield ("\n\n" if self.pages else "") + self._ocr(grey)
                self.pages += 1
            yield "\n"

    def _ocr(self, grey: Image.Image) -> str:
        try:
            text = pytesseract.image_to_string(grey, lang=self.lang, timeout=OCR_TIMEOUT_S)
        except pytesseract.TesseractError as e:
            raise Skipped("OCR failed", str(e).strip()) from None
        except RuntimeError as e:  # pytesseract's timeout
            raise Skipped("OCR failed", str(e)) from None
        return text.replace("\x0c", "").strip()
