"""Where a batch-1 decode step's time goes on a GPU: torch's profiler over a few steps.

    python benchmarks/gpu_decode_profile.py                      # SmolLM2's and GPT-2's shapes
    python benchmarks/gpu_decode_profile.py --shapes smollm2-135m --dtype bfloat16

At batch 1 a small model's decode step is bound by the host issuing kernels, not by the GPU
(SmolLM2's 540 MB of weights read in ~0.14 ms at ~4 TB/s): the table sorted by CPU time names
the operations that cost the host most, with their launches; the one sorted by CUDA time, the
kernels. Random weights in the shapes of benchmarks/gpu_real_model.py; each model first decodes
`--warmup` untimed steps, then `--steps` timed ones (ms/token printed), then profiles
`--profiled` more. `--cpu-smoke` runs it on a tiny shape on the CPU.
"""

from __future__ import annotations

import argparse
import time

import machine
import numpy as np
import torch
from gpu_real_model import SHAPES, SMOKE
from torch.profiler import ProfilerActivity, profile

from sheepop.config.schema import Config, ModelConfig
from sheepop.inference.load import build
from sheepop.model import GPT


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", choices=SHAPES, default=list(SHAPES))
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    ap.add_argument("--warmup", type=int, default=64)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--profiled", type=int, default=4)
    ap.add_argument("--rows", type=int, default=22, help="rows of each table")
    ap.add_argument("--cpu-smoke", action="store_true")
    args = ap.parse_args()
    device, shapes = "cuda", {n: SHAPES[n] for n in args.shapes}
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    if args.cpu_smoke:
        device, shapes, activities = "cpu", {"smoke": SMOKE}, [ProfilerActivity.CPU]
        args.warmup, args.steps, args.profiled = 2, 2, 1
    elif not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --cpu-smoke to check the script here")
    where = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    print(f"{where}; host: {machine.summary()}", flush=True)
    for name, shape in shapes.items():
        config = Config()
        config.model = ModelConfig(**shape)
        torch.manual_seed(0)
        lm = build(config, GPT(config.model).numpy_weights(), None, "torch", device,
                   args.dtype).lm
        token = int(np.argmax(lm.prefill(list(range(32)))))
        for _ in range(args.warmup):
            token = int(np.argmax(lm.decode(token)))
        t0 = time.perf_counter()
        for _ in range(args.steps):
            token = int(np.argmax(lm.decode(token)))
        ms = (time.perf_counter() - t0) / args.steps * 1e3
        print(f"{name} {args.dtype} on {device}: {ms:.2f} ms/token, batch 1", flush=True)
        with profile(activities=activities) as prof:
            for _ in range(args.profiled):
                token = int(np.argmax(lm.decode(token)))
        table = prof.key_averages()
        print(table.table(sort_by="cpu_time_total", row_limit=args.rows,
                          max_name_column_width=60), flush=True)
        if device == "cuda":
            print(table.table(sort_by="cuda_time_total", row_limit=args.rows // 2,
                              max_name_column_width=70), flush=True)


if __name__ == "__main__":
    main()
