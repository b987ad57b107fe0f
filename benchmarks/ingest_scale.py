"""Ingestion at scale: generate a corpus, run `sheepop prepare` on it, print the figures.

    python benchmarks/ingest_scale.py                 # 1 GB of text, code and HTML files
    python benchmarks/ingest_scale.py --mb 200 --workers 2 --pdf-pages 200 --ocr-pages 10

Prints: text MB/s through the whole pipeline (extract, dedup, tokenizer training, tokenize,
write) and the peak resident memory of the prepare process tree (sampled from /proc every
0.1 s: the parent plus its workers, summed) next to the corpus size, to show that memory does
not grow with the input; then PDF pages/s and OCR pages/s (extraction alone, one process).
The corpus is written to a temporary folder and deleted afterwards.
"""

from __future__ import annotations

import argparse
import codecs
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import machine
import numpy as np

WORDS = ("the of and to in is that for it as with was on be by this are from at or an "
         "which not have has but were can all their one its also more other than these into "
         "model data training token layer attention gradient loss weight learning rate "
         "function value matrix vector sequence result order system number state "
         "café naïve résumé déjà über straße — “quoted” …").split()


def _rss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _tree(pid: int) -> list[int]:
    """pid and all its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, stack = [], [pid]
    while stack:
        p = stack.pop()
        out.append(p)
        stack.extend(children.get(p, []))
    return out


def generate_corpus(root: Path, total_mb: float, seed: int = 0) -> int:
    """Unique files of 20 KB .. 2 MB: 80% UTF-8 prose, 8% cp1252 prose, 7% Python, 5% HTML."""
    rng = np.random.default_rng(seed)
    words = np.array(WORDS)
    written, n = 0, 0
    target = int(total_mb * 1e6)
    while written < target:
        size = int(min(rng.lognormal(11.5, 1.0), 2e6, target - written + 1000))
        count = max(size // 6, 8)
        body = " ".join(words[rng.integers(0, len(words), count)])
        body = body.replace(" . ", ".\n")
        lines = [body[i:i + 80] for i in range(0, len(body), 80)]
        text = f"document {n}\n" + "\n".join(lines) + "\n"
        kind = rng.random()
        folder = root / f"d{n // 500:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        if kind < 0.80:
            data, name = text.encode("utf-8"), f"f{n}.txt"
        elif kind < 0.88:
            data = codecs.BOM_UTF8 * 0 + text.replace("—", "-").replace("“", '"') \
                .replace("”", '"').replace("…", "...").encode("cp1252", "replace")
            name = f"f{n}.md"
        elif kind < 0.95:
            code = "".join(f"def f{i}(x):\n    return x * {i}  # {lines[i % len(lines)]}\n"
                           for i in range(count // 12))
            data, name = f"# file {n}\n{code}".encode(), f"m{n}.py"
        else:
            paras = "".join(f"<p>{line}</p>\n" for line in lines)
            data = f"<html><body><h1>page {n}</h1>{paras}</body></html>".encode()
            name = f"p{n}.html"
        (folder / name).write_bytes(data)
        written += len(data)
        n += 1
    return n


def run_prepare(corpus: Path, out: Path, workers: int, tokenizer: str) -> dict:
    cmd = [sys.executable, "-m", "sheepop", "prepare", str(corpus), "--out", str(out),
           "--workers", str(workers), "--tokenizer", tokenizer, "--no-progress"]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak_sum = peak_one = 0
    while proc.poll() is None:
        rss = [_rss_kib(p) for p in _tree(proc.pid)]
        peak_sum, peak_one = max(peak_sum, sum(rss)), max(peak_one, max(rss, default=0))
        time.sleep(0.1)
    seconds = time.perf_counter() - start
    output = proc.stdout.read() if proc.stdout else ""
    if proc.returncode:
        raise SystemExit(f"prepare failed ({proc.returncode}):\n{output}")
    return {"seconds": seconds, "peak_sum_mb": peak_sum / 1024, "peak_one_mb": peak_one / 1024,
            "output": output}


def pdf_pages_per_second(tmp: Path, pages: int) -> float:
    from reportlab.lib.pagesizes import A4
    from reportlab.pdfgen import canvas

    from sheepop.data.ingest.pdf import PdfFile

    path = tmp / "bench.pdf"
    c = canvas.Canvas(str(path), pagesize=A4)
    rng = np.random.default_rng(1)
    for _ in range(pages):
        text = c.beginText(40, 800)
        text.setFont("Helvetica", 10)
        for _ in range(60):
            text.textLine(" ".join(rng.choice(WORDS[:60], 14)))
        c.drawText(text)
        c.showPage()
    c.save()
    start = time.perf_counter()
    reader = PdfFile(path)
    chars = sum(len(page) for page in reader)
    seconds = time.perf_counter() - start
    assert reader.pages == pages and chars > pages * 1000
    return pages / seconds


def ocr_pages_per_second(tmp: Path, pages: int) -> float:
    from PIL import Image, ImageDraw, ImageFont

    from sheepop.data.ingest.image import ImageFile

    font = ImageFont.load_default(size=28)
    rng = np.random.default_rng(2)
    paths = []
    for k in range(pages):  # an A4-like page at ~150 dpi, 30 lines of text
        image = Image.new("L", (1240, 1754), 255)
        draw = ImageDraw.Draw(image)
        for i in range(30):
            draw.text((60, 60 + 54 * i), " ".join(rng.choice(WORDS[:60], 8)), font=font, fill=0)
        paths.append(tmp / f"page{k}.png")
        image.save(paths[-1])
    start = time.perf_counter()
    chars = sum(len("".join(ImageFile(p))) for p in paths)
    seconds = time.perf_counter() - start
    assert chars > pages * 500
    return pages / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=1024, help="corpus size in MB (default 1 GB)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--tokenizer", default="char")
    ap.add_argument("--pdf-pages", type=int, default=200)
    ap.add_argument("--ocr-pages", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where to make the temporary folder")
    args = ap.parse_args()
    print(machine.summary(), flush=True)
    with tempfile.TemporaryDirectory(prefix="sheepop-ingest-bench-", dir=args.dir) as tmp:
        tmp = Path(tmp)
        t0 = time.perf_counter()
        files = generate_corpus(tmp / "corpus", args.mb)
        size = sum(p.stat().st_size for p in (tmp / "corpus").rglob("*") if p.is_file())
        print(f"corpus: {files:,} files, {size / 1e6:,.0f} MB "
              f"(generated in {time.perf_counter() - t0:.0f} s)")
        result = run_prepare(tmp / "corpus", tmp / "data", args.workers, args.tokenizer)
        print(result["output"].rstrip().splitlines()[-1])
        print(f"prepare: {result['seconds']:.1f} s, {size / 1e6 / result['seconds']:.2f} MB/s "
              f"with {args.workers} workers, {args.tokenizer} tokenizer")
        stages = dict(re.findall(r"(extract|tokenizer|tokenize) ([0-9.]+) s", result["output"]))
        if stages:
            print(f"stages: extract {size / 1e6 / float(stages['extract']):.1f} MB/s, "
                  f"tokenizer training {float(stages['tokenizer']):.0f} s, tokenize "
                  f"{size / 1e6 / float(stages['tokenize']):.1f} MB/s (input MB per second)")
        print(f"peak RSS: {result['peak_sum_mb']:.0f} MB (process tree, summed), largest "
              f"process {result['peak_one_mb']:.0f} MB, for a {size / 1e6:,.0f} MB corpus")
        if args.pdf_pages:
            print(f"PDF: {pdf_pages_per_second(tmp, args.pdf_pages):.0f} pages/s "
                  f"({args.pdf_pages} pages of 60 lines, one process)")
        if args.ocr_pages:
            print(f"OCR: {ocr_pages_per_second(tmp, args.ocr_pages):.2f} pages/s "
                  f"({args.ocr_pages} 1240x1754 pages of 30 lines, one process)")


if __name__ == "__main__":
    main()
