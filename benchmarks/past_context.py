"""Generation past the context: the rolling KV cache against recomputing, tokens/s (CPU).

    OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/past_context.py   # torch 1, 2 threads; NumPy
    .venv/bin/python benchmarks/past_context.py --engines torch --threads 1 --repeats 3

A `tiny-llama` model (rope, GQA, SwiGLU) with block_size 256 and random weights (the time of a
step does not depend on the weights) generates `--new-tokens` (1,024) tokens greedily after a
one-token prompt. New tokens 1..255 are inside the context (the cache holds up to 256 tokens);
the rest are past it, where the ring overwrites its oldest column at every step
(sheepop.arch.kv_cache). Timed, per engine:

- cache: `sheepop.generation.generate.generate` with the rolling cache; tokens/s inside and past the
  context, each 1 / the median time between consecutive tokens of that phase;
- window refill: what sheepop does past the context for absolute positions (and did for every
  model before the ring): a prefill of the last 256 tokens per new token (`lm.prefill`, on the
  tokens the cached run produced), 1 / its median step. Its cost per step is constant, so
  `--refill-tokens` steps are enough. The cached run and the refill alternate `--repeats` times
  and each figure keeps its best round (the machine is shared: medians and alternation keep
  another process's burst from landing on one side only). As the two phases of one run come
  at different times, the three kinds of step (a decode inside the context, one in the full
  ring, a window refill) are also timed in blocks taking turns (`interleaved`): their median
  times decide the targets;
- full reference: `use_cache=False`, which for a rope model recomputes the whole sequence since
  the prompt under a sliding-window mask (the exact reference; its step grows with the
  length), over the first `--reference-tokens` new tokens; tokens/s of its steps past the
  context (their count over their total time), and whether its greedy tokens agree with the
  cached ones.

Targets (issue 14): the cache >= 5x faster than recomputation (window refill) past the context,
and tokens/s past the context within 20% of tokens/s inside it. The machine and its load
average are printed at the start and the end: the machine is shared, record them with the
figures. On a busy machine a second thread (torch's, or OpenBLAS's for the NumPy engine) waits
for the first and slows every step many times over: OPENBLAS_NUM_THREADS=1 keeps the NumPy
engine on one core.

Absolute positions (`--absolute`; issue 18):

    nice -n 10 .venv/bin/python benchmarks/past_context.py --absolute --threads 1 2

The `baby` and `tiny` shapes with learned positions (random weights, 65 symbols) generate
greedily after a one-token prompt, once per chunk C of `--chunks` (fractions of T: 8 is T / 8;
1 is chunk 1, the old refill per token), taking turns `--repeats` times: past the context the
window drops C tokens at once and the cache is refilled once per C tokens
(sheepop.generation.generate).
Inside: the T - 1 decode steps that fill the context; past: whole periods of C steps after it
(at least two, and at least `--refill-tokens` steps); each is the count of steps over their
total time (a period mixes one refill with C - 1 decodes: a median would hide the refill).
Per chunk: the best inside and past rates, and the median over rounds of past / inside (both
from the same run). Target: past / inside >= 1/3 at the default chunk (T / 4). torch runs at
each of `--threads`; the NumPy engine at each as BLAS threads (threadpoolctl).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time

import machine
import numpy as np
import torch

from sheepop.config.build import build_config
from sheepop.config.model_size import kv_cache_bytes_per_token
from sheepop.config.schema import ModelConfig, SampleConfig
from sheepop.generation.generate import DEFAULT_CHUNK_FRACTION, generate
from sheepop.model import GPT, TorchLM
from sheepop.scratch.lm import NumpyLM

TARGET_SPEEDUP, TARGET_PAST_RATIO = 5.0, 0.8
TARGET_ABSOLUTE_RATIO = 1 / 3  # issue 18: past the context within 3x of inside it


def model_config(block_size: int, vocab: int) -> ModelConfig:
    cfg = build_config("tiny-llama").model
    return dataclasses.replace(cfg, block_size=block_size, vocab_size=vocab, dropout=0.0)


def step_times(lm, new: int, use_cache: bool, prompt: int = 3, chunk: int = 0
               ) -> tuple[list[float], list[int]]:
    """Seconds between consecutive greedy tokens (step n computes the logits token n is drawn
    from; step 0 is the prefill) and the tokens."""
    sc = SampleConfig(max_new_tokens=new, temperature=0, slide_chunk=chunk)
    times, tokens = [], []
    t0 = time.perf_counter()
    for step in generate(lm, [prompt], sc, use_cache=use_cache):
        t1 = time.perf_counter()
        times.append(t1 - t0)
        tokens.append(step.token)
        t0 = t1
    return times, tokens


def rate(times: list[float]) -> float:
    """tokens/s from the median step: robust to another process taking the core for a while."""
    return 1.0 / float(np.median(times)) if times else float("nan")


def window_refill(lm, tokens: list[int], steps: int, T: int, prompt: int = 3) -> list[float]:
    """Seconds per step of a prefill of the last T tokens per new token, past the context."""
    ids = [prompt] + tokens
    times = []
    for end in range(T, min(T + steps, len(ids))):  # from the first step whose window is full
        t0 = time.perf_counter()
        int(np.argmax(lm.prefill(ids[end - T:end])))
        times.append(time.perf_counter() - t0)
    return times


def cached_and_refill(lm, args: argparse.Namespace, inside: int
                      ) -> tuple[float, float, float, list[int]]:
    """Best tokens/s of the cache inside and past the context, and of the window refill, over
    `repeats` rounds that alternate the two (so a change of load hits both), and the tokens.
    Step n (n >= 1) decodes with n + 1 tokens in the cache: steps 1..inside fit the context."""
    best_in = best_past = best_refill = 0.0
    tokens: list[int] = []
    for _ in range(args.repeats):
        times, tokens = step_times(lm, args.new_tokens, True)
        best_in = max(best_in, rate(times[1:inside + 1]))
        best_past = max(best_past, rate(times[inside + 1:]))
        refill = window_refill(lm, tokens, args.refill_tokens, lm.block_size)
        best_refill = max(best_refill, rate(refill))
    return best_in, best_past, best_refill, tokens


def interleaved(lm, rounds: int, steps: int = 4, prompt: int = 3) -> dict[str, float]:
    """Median seconds of three kinds of step, in blocks of `steps` taking turns `rounds` times
    so that any change of load is spread over all three: a decode with half the context cached
    ("inside", the average step inside the context), a decode in the full ring ("ring") and a
    prefill of a whole window ("refill")."""
    T = lm.block_size
    ids = [(prompt + 7 * i) % 61 for i in range(T)]
    times: dict[str, list[float]] = {"inside": [], "ring": [], "refill": []}
    for _ in range(rounds):
        for kind, n in (("inside", T // 2), ("ring", T), ("refill", T)):
            lm.prefill(ids[:n])
            for _ in range(steps):
                t0 = time.perf_counter()
                lm.prefill(ids) if kind == "refill" else lm.decode(prompt)
                times[kind].append(time.perf_counter() - t0)
    return {kind: float(np.median(t)) for kind, t in times.items()}


def agree(a: list[int], b: list[int]) -> str:
    same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return "all" if same == len(b) else f"the first {same}"


def verdict(ok: bool) -> str:
    return "pass" if ok else "FAIL"


def bench(name: str, lm, args: argparse.Namespace) -> None:
    T = lm.block_size
    inside = T - 1  # a one-token prompt: the cache is full after 255 new tokens' steps
    step_times(lm, 8, True)  # warm-up
    cache_in, cache_past, refill, tokens = cached_and_refill(lm, args, inside)
    steps = interleaved(lm, 16 * args.repeats)
    past_ratio, speedup = steps["inside"] / steps["ring"], steps["refill"] / steps["ring"]
    print(f"{name}\n  cache: {cache_in:.1f} tok/s inside the context, {cache_past:.1f} past it "
          f"(past / inside {cache_past / cache_in:.2f})\n"
          f"  window refill: {refill:.1f} tok/s ({args.refill_tokens} steps): the cache is "
          f"{cache_past / refill:.1f}x faster", flush=True)
    if args.reference_tokens > T:
        times, ref = step_times(lm, args.reference_tokens, False)
        full = (len(times) - inside - 1) / sum(times[inside + 1:])  # its steps grow
        print(f"  full reference (use_cache=False, {args.reference_tokens} new tokens): "
              f"{full:.1f} tok/s past the context: the cache is {cache_past / full:.1f}x "
              f"faster; greedy tokens agree: {agree(tokens, ref)}", flush=True)
    ms = ", ".join(f"{kind} {t * 1e3:.2f}" for kind, t in steps.items())
    print(f"  interleaved median steps (ms): {ms}\n"
          f"  targets (interleaved): cache >= {TARGET_SPEEDUP:.0f}x the window refill: "
          f"{speedup:.1f}x {verdict(speedup >= TARGET_SPEEDUP)}; a step past the context "
          f"within 20% of one inside: {past_ratio:.2f} {verdict(past_ratio >= TARGET_PAST_RATIO)}",
          flush=True)


def absolute(name: str, lm, args: argparse.Namespace) -> None:
    """Inside against past the context with the chunked slide, for each chunk of `--chunks`."""
    T = lm.block_size
    chunks = [max(1, T // f) if f > 1 else 1 for f in args.chunks]
    past = {c: max(2, -(-args.refill_tokens // c)) * c for c in chunks}  # whole periods
    step_times(lm, 8, True)  # warm-up
    rounds: dict[int, list[tuple[float, float]]] = {c: [] for c in chunks}
    for _ in range(args.repeats):
        for c in chunks:  # taking turns, so that a change of load hits every chunk
            times, _ = step_times(lm, T + past[c], True, chunk=c)
            inside, after = times[1:T], times[T:]  # step n sees n + 1 tokens
            rounds[c].append((len(inside) / sum(inside), len(after) / sum(after)))
    for c in chunks:
        ins, outs = zip(*rounds[c])
        ratio = float(np.median([o / i for i, o in rounds[c]]))
        label = " (the default)" if c == T // DEFAULT_CHUNK_FRACTION else ""
        label = " (the old refill per token)" if c == 1 else label
        print(f"  {name}, chunk {c}{label}: {max(ins):.1f} tok/s inside the context, "
              f"{max(outs):.1f} past it ({past[c]} steps); past / inside {ratio:.2f} "
              f"{verdict(ratio >= TARGET_ABSOLUTE_RATIO)}", flush=True)


def absolute_main(args: argparse.Namespace) -> None:
    from threadpoolctl import threadpool_limits
    print(f"start: {machine.summary()}")
    print(f"torch {torch.__version__}, numpy {np.__version__}; learned positions, float32, "
          f"greedy, one-token prompt, random weights, vocabulary {args.vocab}; target past / "
          f"inside >= {TARGET_ABSOLUTE_RATIO:.2f}")
    for preset in args.presets:
        cfg = dataclasses.replace(build_config(preset).model, pos_encoding="learned",
                                  vocab_size=args.vocab, dropout=0.0)
        torch.manual_seed(0)
        model = GPT(cfg)
        print(f"{preset}: {cfg.n_layer} layers, width {cfg.n_embd}, block_size "
              f"{cfg.block_size}, {model.num_params():,} parameters", flush=True)
        for engine in args.engines:
            for threads in args.threads:
                torch.set_num_threads(threads)
                with threadpool_limits(threads):
                    lm = TorchLM(model) if engine == "torch" else NumpyLM(
                        cfg, model.numpy_weights())
                    absolute(f"{engine} {threads} thread{'s' if threads > 1 else ''}", lm, args)
    print(f"end: {machine.summary()}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engines", nargs="+", default=["torch", "numpy"],
                   choices=("torch", "numpy"))
    p.add_argument("--threads", nargs="+", type=int, default=[1, 2],
                   help="torch thread counts to time, one after the other")
    p.add_argument("--block-size", type=int, default=256)
    p.add_argument("--vocab", type=int, default=65)
    p.add_argument("--new-tokens", type=int, default=1024)
    p.add_argument("--refill-tokens", type=int, default=32,
                   help="window-refill steps timed (each costs the same)")
    p.add_argument("--reference-tokens", type=int, default=320,
                   help="new tokens of the full reference (use_cache=False; 0: skip it)")
    p.add_argument("--repeats", type=int, default=2, help="cached runs; the best one counts")
    p.add_argument("--absolute", action="store_true",
                   help="time learned positions (the chunked slide) instead of rope")
    p.add_argument("--presets", nargs="+", default=["baby", "tiny"],
                   help="--absolute: the model shapes")
    p.add_argument("--chunks", nargs="+", type=int, default=[1, 16, 8, 4, 2],
                   help="--absolute: chunks as fractions of T (8: T / 8; 1: chunk 1)")
    args = p.parse_args()
    if args.absolute:
        return absolute_main(args)
    cfg = model_config(args.block_size, args.vocab)
    torch.manual_seed(0)
    model = GPT(cfg)
    print(f"start: {machine.summary()}")
    print(f"torch {torch.__version__}, numpy {np.__version__}; tiny-llama (4 layers, 4 query / "
          f"{cfg.kv_heads} key-value heads, width {cfg.n_embd}, rope, swiglu), block_size "
          f"{cfg.block_size}, {model.num_params():,} parameters, KV cache "
          f"{kv_cache_bytes_per_token(cfg) / 1024:.1f} KiB/token; float32, greedy, one-token "
          f"prompt, {args.new_tokens} new tokens ({cfg.block_size - 1} inside the context)")
    for engine in args.engines:
        if engine == "torch":
            for threads in args.threads:
                torch.set_num_threads(threads)
                bench(f"torch {threads} thread{'s' if threads > 1 else ''}", TorchLM(model), args)
        else:
            blas = os.environ.get("OPENBLAS_NUM_THREADS", "default")
            bench(f"numpy (BLAS {blas})", NumpyLM(cfg, model.numpy_weights()), args)
    print(f"end: {machine.summary()}")


if __name__ == "__main__":
    main()
