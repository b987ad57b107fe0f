"""Step time and tokens/s of the torch and NumPy engines on the same model and batch (CPU).

    .venv/bin/python benchmarks/engines.py [--steps 20] [--warmup 5] [--threads 0]
    OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/engines.py --threads 1   # one core each

Both engines run full training steps through their training-loop adapters (forward, backward,
clipping, AdamW) on the same weights and random batches, dropout 0, float32, taking turns step by
step so that a change in the machine's load affects both alike. Printed: median and minimum ms
per step, tokens per second, the NumPy/torch ratio (the target is <= 2), a float64 line for the
NumPy engine and the forward/backward split of a NumPy step. Record the load with the figures.
"""

from __future__ import annotations

import argparse
import statistics
import time

import machine
import numpy as np

from sheepop.config.schema import ModelConfig, TrainConfig
from sheepop.scratch.gpt import gpt_backward, gpt_forward

CONFIGS = {
    # The reference configuration of docs/architecture.md's field notes.
    "4L-4H-128d-T64-B12": (ModelConfig(vocab_size=96, block_size=64, n_layer=4, n_head=4,
                                       n_embd=128, dropout=0.0), 12),
    "tiny preset 4L-4H-128d-T128-B16": (ModelConfig(vocab_size=96, block_size=128, n_layer=4,
                                                    n_head=4, n_embd=128, dropout=0.0), 16),
    "6L-6H-192d-T128-B8": (ModelConfig(vocab_size=96, block_size=128, n_layer=6, n_head=6,
                                       n_embd=192, dropout=0.0), 8),
}


def time_interleaved(engines, batches, steps: int, warmup: int
                     ) -> list[tuple[list[float], list[float]]]:
    """(wall seconds, CPU seconds of this process) per optimizer step of each engine, the
    engines taking turns step by step, so that a change in the machine's load affects them
    alike. CPU time counts every thread of the process and is less sensitive to other jobs."""
    times: list[tuple[list[float], list[float]]] = [([], []) for _ in engines]
    for i in range(warmup + steps):
        for engine, (wall, cpu) in zip(engines, times):
            t0, c0 = time.perf_counter(), time.process_time()
            engine.train_step([batches[i % len(batches)]], 1e-3)
            if i >= warmup:
                wall.append(time.perf_counter() - t0)
                cpu.append(time.process_time() - c0)
    return times


def split_numpy(params, cfg, batches, repeats: int = 10) -> tuple[float, float]:
    """Median forward and backward seconds of the NumPy model (no optimizer)."""
    fwd, bwd = [], []
    for i in range(repeats + 2):
        x, y = batches[i % len(batches)]
        t0 = time.perf_counter()
        _, _, cache = gpt_forward(params, cfg, x, y)
        t1 = time.perf_counter()
        gpt_backward(cache)
        t2 = time.perf_counter()
        if i >= 2:
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
    return statistics.median(fwd), statistics.median(bwd)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    ap.add_argument("--config", choices=list(CONFIGS), action="append",
                    help="configurations to run (default: all)")
    args = ap.parse_args()

    import torch

    from sheepop.train.engine_numpy import NumpyEngine
    from sheepop.train.engine_torch import TorchEngine
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"{machine.summary()}; {torch.get_num_threads()} torch threads")
    for name in args.config or list(CONFIGS):
        cfg, B = CONFIGS[name]
        rng = np.random.default_rng(0)
        batches = [(rng.integers(0, cfg.vocab_size, (B, cfg.block_size)),
                    rng.integers(0, cfg.vocab_size, (B, cfg.block_size))) for _ in range(4)]
        tokens = B * cfg.block_size
        tcfg = TrainConfig(device="cpu", dtype="float32", grad_clip=1.0)
        torch_engine = TorchEngine(cfg, tcfg)
        weights = torch_engine.weights()
        numpy_engine = NumpyEngine(cfg, tcfg, weights)
        t_torch, t_numpy = time_interleaved([torch_engine, numpy_engine], batches, args.steps,
                                            args.warmup)
        f64 = NumpyEngine(cfg, TrainConfig(dtype="float64", grad_clip=1.0), weights)
        (t_f64,) = time_interleaved([f64], batches, max(3, args.steps // 4), 2)
        fwd, bwd = split_numpy(numpy_engine.model.params, cfg, batches)
        print(f"\n{name}: {numpy_engine.num_params():,} parameters, {tokens} tokens/step")
        print("                 wall ms/step (median, min)   CPU ms/step   tokens/s (median)")
        for label, (wall, cpu) in (("torch float32", t_torch), ("numpy float32", t_numpy),
                                   ("numpy float64", t_f64)):
            med = statistics.median(wall)
            print(f"  {label}  {med * 1e3:9.1f} {min(wall) * 1e3:9.1f}       "
                  f"{statistics.median(cpu) * 1e3:9.1f}   {tokens / med:10,.0f}")
        ratio = statistics.median(t_numpy[0]) / statistics.median(t_torch[0])
        print(f"  numpy / torch (float32): {ratio:.2f}x median wall, "
              f"{min(t_numpy[0]) / min(t_torch[0]):.2f}x min wall; numpy forward "
              f"{fwd * 1e3:.1f} ms, backward {bwd * 1e3:.1f} ms")

if __name__ == "__main__":
    main()
