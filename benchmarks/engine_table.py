"""The measurements `--engine auto` chooses by: both engines' decode and prefill speed over model
sizes and thread counts, float32 on the CPU, one process, the engines taking turns.

    nice python benchmarks/engine_table.py                          # every shape, 1 and 2 threads
    nice python benchmarks/engine_table.py --shapes toy smollm2 --threads 1 --rounds 5

For each shape of benchmarks/decode_shapes.py (random weights: the speed of trained ones) and
each thread count (sheepop.threads.apply: torch's pools, OpenBLAS, OpenMP), it builds both
engines on the same weights and alternates them `--rounds` times: greedy decoding of
`--new-tokens` tokens after a 16-token prompt (tokens/s over the decode steps) and the prefill
of a `--prefill-tokens`-token prompt (tokens/s). It prints medians, numpy / torch ratios, the
load average, and one JSON line per row, the table sheepop/inference/engine_choice.py holds.
"""

from __future__ import annotations

import argparse
import json
import os

import decode_shapes as shapes
import machine

from sheepop import threads
from sheepop.config.model_size import param_count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=list(shapes.SHAPES),
                    choices=list(shapes.SHAPES))
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=33)
    ap.add_argument("--prefill-tokens", type=int, default=128)
    args = ap.parse_args()
    print(f"{machine.summary()}; float32, medians of {args.rounds} alternations")
    print("| shape | parameters | MB read/token | threads | numpy decode tok/s | torch decode "
          "tok/s | numpy/torch | numpy prefill tok/s | torch prefill tok/s | numpy/torch | load |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for shape in args.shapes:
        cfg = shapes.shape_config(shape)
        models = shapes.build_models(cfg, ["numpy", "torch"])
        V = cfg.model.vocab_size
        short = shapes.prompt_ids(V, 16)
        long = shapes.prompt_ids(V, min(args.prefill_tokens, cfg.model.block_size))
        new = min(args.new_tokens, cfg.model.block_size - len(short))
        for n in args.threads:
            threads.apply(n)
            for lm in models.values():  # warm-up: first-call allocations, page faults
                shapes.decode_seconds(lm, short, 3)
            dec = shapes.alternate(
                {e: lambda lm=lm, s=short, k=new: shapes.decode_seconds(lm, s, k)[0]
                 for e, lm in models.items()}, args.rounds)
            pre = shapes.alternate({e: lambda lm=lm, p=long: shapes.prefill_seconds(lm, p)
                                    for e, lm in models.items()}, args.rounds)
            d = {e: (new - 1) / s for e, s in dec.items()}
            p = {e: len(long) / s for e, s in pre.items()}
            row = {"shape": shape, "params": param_count(cfg.model),
                   "bytes_per_token": shapes.bytes_per_token(cfg, len(short) + new // 2),
                   "threads": n,
                   "decode": d, "prefill": p, "load": round(os.getloadavg()[0], 2)}
            rows.append(row)
            print(f"| {shape} | {row['params'] / 1e6:.1f}M | {row['bytes_per_token'] / 1e6:.1f} "
                  f"| {n} | {d['numpy']:.1f} | {d['torch']:.1f} | {d['numpy'] / d['torch']:.2f} "
                  f"| {p['numpy']:.0f} | {p['torch']:.0f} | {p['numpy'] / p['torch']:.2f} "
                  f"| {row['load']:.2f} |", flush=True)
        del models
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
