"""BPE training as whole processes: sheepop's command line against Hugging Face `tokenizers`.

    python benchmarks/bpe_memory.py --mb 5 20 [--vocab-size 4096] [--repeat 3] [--workers 0]
    python benchmarks/bpe_memory.py CORPUS... [--vocab-size 4096]

Each contender is one fresh process given the corpus file, so the figures include start-up,
reading the file and every worker process: sheepop is `python -m sheepop tokenizer train
CORPUS --kind bpe` (its own reading, counting and merging), Hugging Face is a short script that
builds the same pre-split (a `Split` on sheepop's pattern, then `ByteLevel`) and calls
`Tokenizer.train([CORPUS])` (its Rust reader; its trainer uses every core). The two alternate,
`--repeat` times each. `--mb` makes corpora of the Python standard library's source (the text
`make run` trains on) in a temporary folder.

Printed per run: wall seconds, CPU seconds (user + system of the process and its children, from
wait4), and peak RSS in MiB: the largest sum of the resident memory of the whole process tree,
sampled every 5 ms from /proc (workers included), or the largest single process's own peak
(VmHWM) if that is higher. Then the medians and the ratios sheepop / HF. Targets: peak RSS
<= 1.5x HF's at 20 MB, wall <= 1.0x HF's (2 cores). The load average is printed at the start
and the end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import machine
from tokenizer_speed import make_stdlib_corpus

# Hugging Face's contender, run as `python -c`: the same set-up as tokenizer_speed.py's
# hf_trainer_tokenizer, written out rather than imported, so that its process loads `tokenizers`
# alone (importing the benchmark would load sheepop and numpy into HF's peak memory).
HF_CHILD = """
import sys
from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers
corpus, n_tokens, out, pattern = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.Sequence([
    pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
trainer = trainers.BpeTrainer(vocab_size=n_tokens, show_progress=False,
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
tok.train([corpus], trainer=trainer)
tok.save(out)
"""

PAGE = os.sysconf("SC_PAGE_SIZE")


def _tree(pid: int) -> list[int]:
    """`pid` and all its descendants (from /proc/PID/task/TID/children)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:  # it ended meanwhile
            continue
    return out


def _rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


def _hwm_bytes(pid: int) -> int:
    """The process's own peak RSS (VmHWM, which starts afresh at exec; wait4's ru_maxrss does
    not: it keeps the forking parent's size)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        pass
    return 0


def measure(cmd: list[str]) -> tuple[float, float, float]:
    """(wall s, CPU s, peak RSS MiB) of `cmd` run to its end as a process tree."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    peak = 0
    while True:
        done, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if done:
            break
        tree = _tree(proc.pid)
        peak = max(peak, sum(map(_rss_bytes, tree)), max(map(_hwm_bytes, tree)))
        time.sleep(0.005)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}")
    return wall, usage.ru_utime + usage.ru_stime, peak / 2**20


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("corpus", nargs="*", help="UTF-8 text files (each trained on alone)")
    ap.add_argument("--mb", type=float, nargs="*", default=[],
                    help="make standard-library corpora of these sizes in MB")
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--pattern", default="gpt2", help="gpt2, gpt4 or gpt2-exact")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workers", type=int, default=0,
                    help="sheepop's --workers (0: one per CPU)")
    args = ap.parse_args(argv)
    if not args.corpus and not args.mb:
        ap.error("give corpus files or --mb SIZES")

    from sheepop.tokenizers.pretokenize import PATTERNS
    pattern = PATTERNS.get(args.pattern, args.pattern)
    specials = 3  # sheepop's default <|bos|> <|eos|> <|pad|>: HF learns as many tokens
    print(f"{machine.summary()}; vocab {args.vocab_size}, {args.repeat} runs each, "
          "alternating")
    with tempfile.TemporaryDirectory() as tmp:
        corpora = [Path(p) for p in args.corpus]
        for mb in args.mb:
            path = Path(tmp) / f"stdlib-{mb:g}mb.txt"
            make_stdlib_corpus(path, mb)
            corpora.append(path)
        out = str(Path(tmp) / "tok.json")
        contenders = {
            "sheepop": [sys.executable, "-m", "sheepop", "tokenizer", "train", "CORPUS",
                        "--kind", "bpe", "--vocab-size", str(args.vocab_size),
                        "--pattern", args.pattern, "--workers", str(args.workers),
                        "--out", out],
            "HF": [sys.executable, "-c", HF_CHILD, "CORPUS",
                   str(args.vocab_size - specials), out, pattern],
        }
        summary = []
        print(f"\n{'corpus':<22} {'who':<8} {'run':>3} {'wall s':>7} {'CPU s':>7} "
              f"{'peak MiB':>9}")
        for corpus in corpora:
            mb = corpus.stat().st_size / 1e6
            runs: dict[str, list[tuple[float, float, float]]] = {k: [] for k in contenders}
            for r in range(args.repeat):
                order = list(contenders) if r % 2 == 0 else list(contenders)[::-1]
                for who in order:
                    cmd = [str(corpus) if a == "CORPUS" else a for a in contenders[who]]
                    res = measure(cmd)
                    runs[who].append(res)
                    print(f"{corpus.name:<22} {who:<8} {r + 1:>3} {res[0]:>7.2f} "
                          f"{res[1]:>7.2f} {res[2]:>9.1f}", flush=True)
            med = {who: [statistics.median(x[i] for x in rs) for i in range(3)]
                   for who, rs in runs.items()}
            summary.append((mb, med))
        print(f"\nmedians   {'sheepop wall/CPU/MiB':>24} {'HF wall/CPU/MiB':>22} "
              f"{'wall':>6} {'CPU':>6} {'memory':>7}  (ratios sheepop / HF)")
        for mb, med in summary:
            s, h = med["sheepop"], med["HF"]
            print(f"{mb:6.2f} MB {s[0]:8.2f} {s[1]:6.2f} {s[2]:7.1f} {h[0]:8.2f} {h[1]:6.2f} "
                  f"{h[2]:6.1f} {s[0] / h[0]:6.2f} {s[1] / h[1]:6.2f} {s[2] / h[2]:7.2f}")
    print(f"\ntargets: memory <= 1.5x at 20 MB, wall <= 1.0x; load average at end: {load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
