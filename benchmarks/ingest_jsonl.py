"""A large JSON Lines file through `sheepop prepare`: throughput and peak memory.

    python benchmarks/ingest_jsonl.py                  # 1 GB file, 2 workers, char tokenizer
    python benchmarks/ingest_jsonl.py --mb 50 --compress zst

Writes one JSONL file of about --mb MB in a temporary folder: documents of 0.5-4 KB of random
prose in a "text" field (plus a small "meta" object), and one bad line in 50 (cycling through
not valid JSON, not an object, no "text" field, a number as "text"). Runs `sheepop prepare` on
it in a subprocess and prints MB/s (input bytes per second of wall time), the stage times, the
peak resident memory of the process tree (sampled every 0.1 s from /proc, parent and workers
summed), and the largest single process (getrusage(RUSAGE_CHILDREN).ru_maxrss). Memory that
stays flat between a small and a 1 GB file shows that no stage holds the text.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import machine  # noqa: E402
from ingest_scale import WORDS, run_prepare  # noqa: E402  (the sibling benchmark)

BAD_EVERY = 50
BAD_LINES = (b"{not json at all\n", b"[\"a list\", \"not an object\"]\n",
             b"{\"title\": \"no text field\"}\n", b"{\"text\": 12345}\n")


def write_jsonl(path: Path, total_mb: float, compress: str, seed: int = 0) -> tuple[int, int]:
    """Write ~total_mb MB of JSONL (uncompressed size); (good lines, bad lines)."""
    rng = np.random.default_rng(seed)
    words = np.array(WORDS)
    target, written, good, bad = int(total_mb * 1e6), 0, 0, 0
    opener = {"none": open, "gz": gzip.open}.get(compress)
    if compress == "zst":
        import zstandard

        def opener(p, mode):  # noqa: E306
            return zstandard.open(p, mode, cctx=zstandard.ZstdCompressor(level=3))
    with opener(path, "wb") as f:
        while written < target:
            n = 0
            if (good + bad + 1) % BAD_EVERY == 0:
                line = BAD_LINES[bad % len(BAD_LINES)]
                bad += 1
            else:
                n = int(rng.integers(80, 640))  # ~6 bytes a word: 0.5-4 KB
                text = " ".join(words[rng.integers(0, len(words), n)].tolist())
                line = (json.dumps({"text": text, "meta": {"id": good}}, ensure_ascii=False)
                        + "\n").encode()
                good += 1
            f.write(line)
            written += len(line)
    return good, bad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=1024, help="file size in MB (default 1 GB)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--tokenizer", default="char")
    ap.add_argument("--compress", choices=("none", "gz", "zst"), default="none")
    ap.add_argument("--dir", default=None, help="where to make the temporary folder")
    args = ap.parse_args()
    suffix = {"none": ".jsonl", "gz": ".jsonl.gz", "zst": ".jsonl.zst"}[args.compress]
    with tempfile.TemporaryDirectory(prefix="sheepop-jsonl-bench-", dir=args.dir) as tmp:
        path = Path(tmp) / f"corpus{suffix}"
        t0 = time.perf_counter()
        good, bad = write_jsonl(path, args.mb, args.compress)
        size = path.stat().st_size
        print(f"file: {size / 1e6:,.0f} MB on disk ({args.compress}), {good:,} documents, "
              f"{bad:,} bad lines (generated in {time.perf_counter() - t0:.0f} s)")
        result = run_prepare(path, Path(tmp) / "data", args.workers, args.tokenizer)
        largest = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # KiB on Linux
        output = result["output"]
        print(output.rstrip().splitlines()[-1])
        skipped = re.findall(r"^\s+([\d,]+)  (not valid JSON|not a JSON object|no field 'text'|"
                             r"'text' not a string)$", output, re.M)
        print("skipped lines: " + ", ".join(f"{n} {why}" for n, why in skipped))
        mb = args.mb if args.compress != "none" else size / 1e6
        print(f"prepare: {result['seconds']:.1f} s, {mb / result['seconds']:.2f} MB/s of JSONL "
              f"with {args.workers} workers, {args.tokenizer} tokenizer")
        stages = dict(re.findall(r"(extract|tokenizer|tokenize) ([0-9.]+) s", output))
        if stages:
            def rate(stage: str) -> str:  # a stage the log rounds to 0.0 s has no rate to give
                seconds = float(stages[stage])
                return f"{mb / seconds:.1f} MB/s" if seconds else "under 0.05 s"
            print(f"stages: extract {rate('extract')}, tokenizer training "
                  f"{float(stages['tokenizer']):.0f} s, tokenize {rate('tokenize')}")
        print(f"peak RSS: {result['peak_sum_mb']:.0f} MB (process tree, summed), largest "
              f"process {max(largest, result['peak_one_mb']):.0f} MB, for {mb:,.0f} MB of JSONL")
    # Described at the end: torch loaded in this process before `prepare` would count in the
    # largest process's peak (a child's ru_maxrss starts from its parent's when it is made).
    print(f"machine: {machine.summary()}")


if __name__ == "__main__":
    main()
