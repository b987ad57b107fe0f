"""Byte-level BPE speed: sheepop vs Hugging Face `tokenizers`, same corpus, same vocab size.

    python benchmarks/tokenizer_speed.py CORPUS... [--vocab-size 4096] [--repeat 3]
    python benchmarks/tokenizer_speed.py --make-stdlib-corpus corpus.txt --mb 5   # a test corpus

Prints training time (sheepop in one process and with its parallel word count; HF fed the
whole text and fed line by line) and encoding throughput in MB/s of UTF-8 input (sheepop on
one core with a cold and a warm word cache, sheepop in several processes, HF on one string and
with encode_batch on lines). Each figure is the best of --repeat runs. Targets: training at most
1.5x HF's best time, encoding at least 3 MB/s on one core.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import machine


def make_stdlib_corpus(out: Path, megabytes: float) -> None:
    """Concatenate the standard library's Python source (files under the `os` module's folder,
    in sorted order, site-packages left out) up to `megabytes` MB."""
    root = Path(os.__file__).parent
    limit, parts, size = int(megabytes * 1e6), [], 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts:
            continue
        try:
            data = path.read_bytes().decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        parts.append(data)
        size += len(data.encode("utf-8"))
        if size >= limit:
            break
    text = "".join(parts).encode("utf-8")[:limit].decode("utf-8", "ignore")
    out.write_text(text, encoding="utf-8")
    print(f"wrote {out}: {len(text.encode('utf-8')) / 1e6:.2f} MB from {len(parts)} files")


def cpu_seconds() -> float:
    """CPU time of this process, its threads and its finished child processes."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class Table:
    """Rows of (task, who, wall seconds, CPU seconds); each the best wall time of `repeat`.
    CPU time is less disturbed than wall time when other programs share the machine."""

    def __init__(self, repeat: int) -> None:
        self.repeat, self.rows = repeat, []

    def measure(self, task: str, who: str, fn):
        result, best, best_cpu = None, float("inf"), 0.0
        for _ in range(self.repeat):
            start, cpu = time.perf_counter(), cpu_seconds()
            result = fn()
            wall = time.perf_counter() - start
            if wall < best:
                best, best_cpu = wall, cpu_seconds() - cpu
        self.rows.append((task, who, best, best_cpu))
        return best, result

    def print(self, mb: float) -> None:
        print(f"\n{'task':<7} {'who':<44} {'seconds':>8} {'MB/s':>7} {'CPU s':>7}")
        for task, who, sec, cpu in self.rows:
            print(f"{task:<7} {who:<44} {sec:>8.2f} {mb / sec:>7.2f} {cpu:>7.2f}")


def hf_trainer_tokenizer(pattern: str, n_tokens: int):
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    trainer = trainers.BpeTrainer(vocab_size=n_tokens, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    return tok, trainer


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("corpus", nargs="*", help="UTF-8 text files")
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--pattern", default="gpt2", help="gpt2, gpt4 or gpt2-exact")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workers", type=int, default=0, help="processes (0: one per CPU)")
    ap.add_argument("--make-stdlib-corpus", metavar="OUT", type=Path)
    ap.add_argument("--mb", type=float, default=5.0)
    args = ap.parse_args(argv)
    if args.make_stdlib_corpus:
        make_stdlib_corpus(args.make_stdlib_corpus, args.mb)
        return 0
    if not args.corpus:
        ap.error("give a corpus (or make one with --make-stdlib-corpus)")

    from sheepop.tokenizers import loads, train_tokenizer
    from sheepop.tokenizers.parallel import resolve_workers
    from sheepop.tokenizers.pretokenize import PATTERNS

    text = "".join(Path(p).read_text(encoding="utf-8") for p in args.corpus)
    mb = len(text.encode("utf-8")) / 1e6
    workers = resolve_workers(args.workers)
    pattern = PATTERNS.get(args.pattern, args.pattern)
    specials = ["<|bos|>", "<|eos|>", "<|pad|>"]
    n_tokens = args.vocab_size - len(specials)
    print(machine.summary())
    print(f"corpus: {mb:.2f} MB, vocab {args.vocab_size}, pattern {args.pattern}, "
          f"best of {args.repeat}")

    table = Table(args.repeat)
    m = table.measure
    t1, tok = m("train", "sheepop, 1 process", lambda: train_tokenizer(
        "bpe", [text], args.vocab_size, pattern=args.pattern, workers=1))
    tp, _ = m("train", f"sheepop, word count in {workers} processes", lambda: train_tokenizer(
        "bpe", [text], args.vocab_size, pattern=args.pattern, workers=workers))

    import tokenizers
    from tokenizers import Tokenizer as HFTokenizer

    from sheepop.tokenizers.hf import to_hf_dict
    lines = text.splitlines(keepends=True)

    def hf_train(data):
        hf, trainer = hf_trainer_tokenizer(pattern, n_tokens)
        hf.train_from_iterator(data, trainer=trainer)
        return hf
    version = tokenizers.__version__
    th_whole, _ = m("train", f"HF tokenizers {version}, whole text", lambda: hf_train([text]))
    th_lines, _ = m("train", f"HF tokenizers {version}, line by line", lambda: hf_train(lines))

    json_text = tok.to_json()
    cold, ids = m("encode", "sheepop, 1 core, cold cache", lambda: loads(json_text).encode(text))
    warm, _ = m("encode", "sheepop, 1 core, warm cache", lambda: tok.encode(text))
    _, par_ids = m("encode", f"sheepop, {workers} processes",
                   lambda: loads(json_text).encode_parallel(text, workers=workers))
    assert par_ids == ids, "parallel encoding differs from serial"

    hf = HFTokenizer.from_str(json.dumps(to_hf_dict(tok)))
    _, h_ids = m("encode", "HF, one string", lambda: hf.encode(text).ids)
    m("encode", "HF, encode_batch(lines)", lambda: hf.encode_batch(lines))
    same = "yes" if h_ids == ids else "NO"
    table.print(mb)

    hf_best = min(th_whole, th_lines)
    ours = min(t1, tp)
    print(f"\ntraining: sheepop {ours:.2f} s = {ours / hf_best:.2f}x HF's best "
          f"({hf_best:.2f} s)  [target <= 1.5x]")
    cpu = {who: c for _, who, _, c in table.rows}
    print(f"encoding on one core: {mb / cold:.2f} MB/s cold, {mb / warm:.2f} MB/s warm "
          f"(per CPU second: {mb / cpu['sheepop, 1 core, cold cache']:.2f} cold)  "
          f"[target >= 3 MB/s];  HF gives the same ids: {same}")
    print(f"{len(ids):,} tokens, {len(text.encode('utf-8')) / len(ids):.2f} bytes/token; "
          f"load average {os.getloadavg()[0]:.1f} at the end (CPU s: all threads and "
          "processes; HF trains with several threads)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
