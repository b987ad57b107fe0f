"""The KV cache's memory as it grows with the tokens, and what growing costs in decode speed.

    .venv/bin/python benchmarks/kv_cache_memory.py                  # memory, then speed
    .venv/bin/python benchmarks/kv_cache_memory.py --tokens 100 500 2000 --rows 16 --skip-speed
    python3 benchmarks/kv_cache_memory.py --device cuda --skip-speed   # the same bytes, faster

Memory. A SmolLM2-135M-shaped model (30 layers, width 576, 9 query / 3 key-value heads of 64,
SwiGLU 1536, rope, context 8,192; random weights: the cache's size does not depend on them, and
`--vocab` may shrink the vocabulary, which it does not depend on either) generates `--tokens`
tokens after an 8-token prompt, and the cache's bytes are printed: allocated now, the peak
(the old and the new buffers during the last growth), and what a cache preallocated to the whole
context held, as every cache did before it grew (sheepop.arch.kv_cache). Then `--rows`
sequences run together in the server's running batch (sheepop.generation.running_batch), and its
bytes are printed after `--batch-steps` decode steps, against `--rows` whole contexts.

Speed. A small model (tiny-llama's shape: 4 layers, width 128, 2 of 4 heads; context 4,096,
random weights) generates `--speed-tokens` tokens greedily with a growing cache and with a cache
preallocated to the context, taking turns `--repeats` times in one process (a shared machine:
alternation spreads any change of load over both); tokens/s is the count over the total time of
the decode steps (prefill excluded), best round of each, and the ratio growing / preallocated.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import machine
import numpy as np
import torch

from sheepop.arch.kv_cache import KVCache, cache_shape, describe_memory, slides
from sheepop.config.build import build_config
from sheepop.config.schema import ModelConfig, SampleConfig
from sheepop.generation.generate import generate
from sheepop.generation.running_batch import RunningBatch
from sheepop.model import GPT, TorchLM
from sheepop.scratch.lm import NumpyLM

SMOLLM2 = dict(n_layer=30, n_embd=576, n_head=9, n_kv_head=3, d_ff=1536, block_size=8192,
               pos_encoding="rope", rope_theta=100000.0, norm="rmsnorm", ffn="swiglu",
               bias=False, tie_weights=True, dropout=0.0)


def mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def make_lm(engine: str, cfg: ModelConfig, seed: int = 0, device: str = "cpu"):
    torch.manual_seed(seed)
    model = GPT(cfg)
    if engine == "torch":
        return TorchLM(model.to(device))
    return NumpyLM(cfg, model.numpy_weights())


def preallocated(engine: str, cfg: ModelConfig) -> KVCache:
    """One sequence's cache of the whole context, allocated at once (every cache before)."""
    shape = cache_shape(cfg, 1)
    if engine == "torch":
        return KVCache(torch.zeros(shape), torch.zeros(shape), slides(cfg))
    return KVCache(np.zeros(shape, np.float32), np.zeros(shape, np.float32), slides(cfg))


def memory(args: argparse.Namespace) -> None:
    cfg = ModelConfig(vocab_size=args.vocab, **SMOLLM2)
    lm = make_lm(args.engine, cfg, device=args.device)
    per_token = 2 * cfg.n_layer * cfg.kv_heads * cfg.head_dim * 4
    full = cfg.block_size * per_token
    print(f"\nSmolLM2-shaped, {args.engine} engine on {args.device}, float32: {per_token:,} "
          f"bytes per position; the whole context ({cfg.block_size:,}) of one sequence: "
          f"{full:,} bytes ({mib(full)})")
    print("| new tokens | positions held | allocated | peak | preallocated | allocated / "
          "preallocated |")
    print("|---|---|---|---|---|---|")
    prompt = list(range(1, 9))
    for n in args.tokens:
        lm.cache = lm._new_cache(1)  # a fresh cache each time (a process generating once)
        sc = SampleConfig(max_new_tokens=n, temperature=1.0, seed=0)
        t0 = time.perf_counter()
        count = sum(1 for _ in generate(lm, prompt, sc))
        took = time.perf_counter() - t0
        c = lm.cache
        print(f"| {count:,} | {c.length:,} in {c.capacity:,} | {c.nbytes:,} ({mib(c.nbytes)}) "
              f"| {mib(c.peak_bytes)} | {mib(full)} | {c.nbytes / full:.3f} |")
        print(f"  sheepop generate would print: {describe_memory(c)}  [{took:.0f} s]")
    batch = RunningBatch(lm, args.rows)
    rng = np.random.default_rng(0)
    prompts = [[int(t) for t in rng.integers(1, args.vocab, int(rng.integers(10, 60)))]
               for _ in range(args.rows)]
    first = batch.join(prompts)
    last = [int(np.argmax(z)) for z in first]
    print(f"\n{args.rows} sequences in the server's running batch (prompts of 10-59 tokens):")
    print(f"  after joining: {batch.nbytes:,} bytes ({mib(batch.nbytes)}), "
          f"{batch.store.batch} rows x {batch.store.capacity} columns")
    done = 0
    for steps in sorted(args.batch_steps):
        t0 = time.perf_counter()
        for _ in range(steps - done):
            last = [int(np.argmax(z)) for z in batch.step(last)]
        done = steps
        print(f"  after {steps:,} decode steps: {batch.nbytes:,} bytes ({mib(batch.nbytes)}), "
              f"{batch.store.batch} rows x {batch.store.capacity} columns, peak "
              f"{mib(batch.peak_bytes)}; {args.rows} whole contexts: {mib(args.rows * full)} "
              f"[{time.perf_counter() - t0:.0f} s]")
    batch.leave(list(range(batch.rows)))
    print(f"  after every sequence left: {batch.nbytes:,} bytes")


def decode_rate(lm, n: int) -> float:
    """tokens/s of the decode steps of one greedy generation of n tokens (prefill excluded)."""
    sc = SampleConfig(max_new_tokens=n, temperature=0.0)
    steps = generate(lm, [1, 2, 3], sc)
    next(steps)  # the prefill's token
    t0 = time.perf_counter()
    count = sum(1 for _ in steps)
    return count / (time.perf_counter() - t0)


def speed(args: argparse.Namespace) -> None:
    cfg = dataclasses.replace(build_config("tiny-llama").model, block_size=4096, vocab_size=256,
                              dropout=0.0)
    print(f"\nDecode speed, tiny-llama shape, context {cfg.block_size:,}, "
          f"{args.speed_tokens:,} tokens, torch threads {torch.get_num_threads()}:")
    print("| engine | growing tok/s | preallocated tok/s | growing / preallocated | rounds |")
    print("|---|---|---|---|---|")
    for engine in args.engines:
        lm = make_lm(engine, cfg)
        best = {"growing": 0.0, "preallocated": 0.0}
        ratios = []
        for _ in range(args.repeats):
            rates = {}
            for kind in ("growing", "preallocated"):
                lm.cache = lm._new_cache(1) if kind == "growing" else preallocated(engine, cfg)
                rates[kind] = decode_rate(lm, args.speed_tokens)
                best[kind] = max(best[kind], rates[kind])
            ratios.append(rates["growing"] / rates["preallocated"])
        print(f"| {engine} | {best['growing']:.1f} | {best['preallocated']:.1f} | "
              f"{best['growing'] / best['preallocated']:.3f} (median of rounds "
              f"{float(np.median(ratios)):.3f}) | {args.repeats} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[100, 500, 2000])
    p.add_argument("--engine", choices=["torch", "numpy"], default="torch",
                   help="the engine of the memory figures")
    p.add_argument("--vocab", type=int, default=49152)
    p.add_argument("--device", default="cpu", help="of the memory figures' torch model")
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--batch-steps", type=int, nargs="+", default=[100, 500])
    p.add_argument("--skip-memory", action="store_true")
    p.add_argument("--skip-speed", action="store_true")
    p.add_argument("--engines", nargs="+", choices=["torch", "numpy"],
                   default=["torch", "numpy"], help="the engines of the speed figures")
    p.add_argument("--speed-tokens", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(f"machine: {machine.summary()}")
    if not args.skip_memory:
        memory(args)
    if not args.skip_speed:
        speed(args)
    print(f"\nmachine at the end: {machine.summary()}")


if __name__ == "__main__":
    main()
