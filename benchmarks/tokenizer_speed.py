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
import os
import sys
import time
from pathlib import Path


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


def best_time(fn, repeat: int):
    result, best = None, float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


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
    print(f"corpus: {mb:.2f} MB, vocab {args.vocab_size}, pattern {args.pattern}, "
          f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}, best of {args.repeat}")

    rows = []
    t1, tok = best_time(lambda: train_tokenizer("bpe", [text], args.vocab_size,
                                                pattern=args.pattern, workers=1), args.repeat)
    rows.append(("train", "sheepop, 1 process", t1))
    tp, _ = best_time(lambda: train_tokenizer("bpe", [text], args.vocab_size,
                                              pattern=args.pattern, workers=workers), args.repeat)
    rows.append(("train", f"sheepop, word count in {workers} processes", tp))

    import tokenizers
    lines = text.splitlines(keepends=True)

    def hf_train(data):
        hf, trainer = hf_trainer_tokenizer(pattern, n_tokens)
        hf.train_from_iterator(data, trainer=trainer)
        return hf
    th_whole, _ = best_time(lambda: hf_train([text]), args.repeat)
    rows.append(("train", f"HF tokenizers {tokenizers.__version__}, whole text", th_whole))
    th_lines, _ = best_time(lambda: hf_train(lines), args.repeat)
    rows.append(("train", f"HF tokenizers {tokenizers.__version__}, line by line", th_lines))

    json_text = tok.to_json()
    cold, ids = best_time(lambda: loads(json_text).encode(text), args.repeat)
    rows.append(("encode", "sheepop, 1 core, cold cache", cold))
    warm, _ = best_time(lambda: tok.encode(text), args.repeat)
    rows.append(("encode", "sheepop, 1 core, warm cache", warm))
    par, par_ids = best_time(lambda: loads(json_text).encode_parallel(text, workers=workers),
                             args.repeat)
    rows.append(("encode", f"sheepop, {workers} processes", par))
    assert par_ids == ids, "parallel encoding differs from serial"

    import json

    from tokenizers import Tokenizer as HFTokenizer

    from sheepop.tokenizers.hf import to_hf_dict
    hf = HFTokenizer.from_str(json.dumps(to_hf_dict(tok)))
    h_one, h_ids = best_time(lambda: hf.encode(text).ids, args.repeat)
    rows.append(("encode", "HF, one string", h_one))
    h_batch, _ = best_time(lambda: hf.encode_batch(lines), args.repeat)
    rows.append(("encode", "HF, encode_batch(lines)", h_batch))
    same = "yes" if h_ids == ids else "NO"

    print(f"\n{'task':<7} {'who':<44} {'seconds':>8} {'MB/s':>7}")
    for task, who, sec in rows:
        print(f"{task:<7} {who:<44} {sec:>8.2f} {mb / sec:>7.2f}")
    hf_best = min(th_whole, th_lines)
    ours = min(t1, tp)
    print(f"\ntraining: sheepop {ours:.2f} s = {ours / hf_best:.2f}x HF's best "
          f"({hf_best:.2f} s)  [target <= 1.5x]")
    print(f"encoding on one core: {mb / cold:.2f} MB/s cold, {mb / warm:.2f} MB/s warm  "
          f"[target >= 3 MB/s];  HF gives the same ids: {same}")
    print(f"{len(ids):,} tokens, {len(text.encode('utf-8')) / len(ids):.2f} bytes/token")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
