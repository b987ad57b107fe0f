"""Training throughput of the torch engine: ms per iteration and tokens/s.

    python benchmarks/train_throughput.py                       # the reference config, fp32 + bf16
    python benchmarks/train_throughput.py --set model.n_layer=6 --dtype bfloat16 --iters 30

The reference config (n_layer 4, n_head 4, n_embd 128, block 64, batch 12, dropout 0) is the one
a well-known minimal GPT trains at ~48 ms/iter in float32 on these 2-core machines. One
iteration = forward, backward, clipping and an AdamW step on one batch of random tokens.
"""

from __future__ import annotations

import argparse
import time

import machine
import numpy as np
import torch

from sheepop.config.build import build_config
from sheepop.train.engine_torch import TorchEngine

REFERENCE = ["model.n_layer=4", "model.n_head=4", "model.n_embd=128", "model.block_size=64",
             "model.dropout=0", "model.vocab_size=65", "train.batch_size=12"]


def measure(overrides: list[str], dtype: str, iters: int, warmup: int, compile: bool) -> dict:
    cfg = build_config(None, None, REFERENCE + overrides + [f"train.dtype={dtype}",
                                                            f"train.compile={compile}"])
    cfg.validate()
    engine = TorchEngine(cfg.model, cfg.train)
    rng = np.random.default_rng(0)
    B, T, V = cfg.train.batch_size, cfg.model.block_size, cfg.model.vocab_size
    batches = [(rng.integers(0, V, (B, T)), rng.integers(0, V, (B, T)))
               for _ in range(cfg.train.grad_accum)]
    for _ in range(warmup):
        engine.train_step(batches, 1e-3)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        engine.train_step(batches, 1e-3)
        if engine.device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    ms = 1000 * float(np.median(times))
    tokens = B * T * cfg.train.grad_accum
    return {"config": " ".join(overrides) or "reference", "dtype": dtype,
            "params": engine.num_params(), "ms_per_iter": ms, "tokens_per_sec": tokens / ms * 1e3,
            "device": str(engine.device)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--set", dest="overrides", action="append", default=[],
                   help="config override on top of the reference config (repeatable)")
    p.add_argument("--dtype", action="append", help="float32, bfloat16, float16 (repeatable; "
                   "default: float32 and bfloat16)")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    args = p.parse_args()
    print(f"{machine.summary()}; {torch.get_num_threads()} torch threads")
    configs = [[]] + ([args.overrides] if args.overrides else [])
    for overrides in configs:
        for dtype in args.dtype or ["float32", "bfloat16"]:
            r = measure(overrides, dtype, args.iters, args.warmup, args.compile)
            print(f"{r['config']:<40} {r['dtype']:<9} {r['device']:<5} {r['params']:>10,} params "
                  f"{r['ms_per_iter']:8.1f} ms/iter {r['tokens_per_sec']:10,.0f} tokens/s")


if __name__ == "__main__":
    main()
