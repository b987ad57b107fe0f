"""sheepop's training step against nanoGPT's, alternating step for step in one process.

    python benchmarks/vs_nanogpt.py                          # the reference shape, float32
    python benchmarks/vs_nanogpt.py --sheepop float32 --sheepop float32+compile --sheepop bfloat16
    python benchmarks/vs_nanogpt.py --shape baby --iters 20
    python benchmarks/vs_nanogpt.py --nanogpt ~/src/nanoGPT  # nanoGPT's own model.py

Contenders: nanoGPT's step (its own `model.py` from a checkout you point at with --nanogpt, or
without one the faithful re-implementation in benchmarks/nanogpt_reference.py) in float32, as
nanoGPT runs on CPU, and `sheepop.train.engine_torch.TorchEngine.train_step` with sheepop's
defaults for that shape. Both train the same architecture (learned positions, LayerNorm, GELU
MLP 4x, biases, tied head) with the same hyperparameters (AdamW lr 1e-3, betas (0.9, 0.95),
weight decay 0.1 on matrices, clip 1.0) on the same random batches. Each iteration runs one
step of each, the order alternating, so a burst of load on the shared machine lands on both;
the figure is the median of the per-iteration ratios sheepop / nanoGPT (below 1: sheepop is
faster), with the medians of each side's step time. `--curve N` also trains every contender N
steps from the same weights (sheepop's, copied into the re-implementation) on the same batches
and prints the loss curves and their largest gap to nanoGPT's float32 curve. `--floor` also
races the step's work kernels alone (step_floor.py): how far below nanoGPT any step made of
torch's kernels could get on this machine.

Shapes: `reference` (n_layer 4, n_head 4, n_embd 128, block 64, batch 12, vocab 65: nanoGPT's
small character config) and `baby` (6 x 6 x 384, block 256, batch 64, vocab 65).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import machine
import numpy as np
import torch
from nanogpt_reference import (
    ReferenceGPT,
    ReferenceStep,
    Shape,
    load_checkout,
    load_sheepop_weights,
)
from step_floor import floor_step

from sheepop.config.build import build_config
from sheepop.train.engine_torch import TorchEngine

SHAPES = {
    "reference": (Shape(4, 4, 128, 64, 65), 12),
    "baby": (Shape(6, 6, 384, 256, 65), 64),
}


def sheepop_step(shape: Shape, batch: int, contender: str, extra: list[str]):
    """sheepop's step; `contender` is a dtype, + "+compile" for torch.compile."""
    dtype, _, compiled = contender.partition("+")
    cfg = build_config(None, None, [
        f"model.n_layer={shape.n_layer}", f"model.n_head={shape.n_head}",
        f"model.n_embd={shape.n_embd}", f"model.block_size={shape.block_size}",
        f"model.vocab_size={shape.vocab_size}", "model.dropout=0", "model.bias=true",
        "model.tie_weights=true", "model.activation=gelu", "model.pos_encoding=learned",
        f"train.batch_size={batch}", "train.lr=1e-3", "train.weight_decay=0.1",
        "train.beta2=0.95", "train.grad_clip=1.0", f"train.dtype={dtype}",
        f"train.compile={compiled == 'compile'}", *extra])
    cfg.validate()
    engine = TorchEngine(cfg.model, cfg.train)

    def step(x: torch.Tensor, y: torch.Tensor) -> float:
        loss, _ = engine.train_step([(x.numpy(), y.numpy())], 1e-3)
        return loss
    step.engine = engine
    return step


def reference_step(shape: Shape, checkout: str | None):
    torch.manual_seed(0)
    model = load_checkout(checkout, shape) if checkout else ReferenceGPT(shape)
    return ReferenceStep(model.train())


def batches(shape: Shape, batch: int, n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(0, shape.vocab_size, (n, batch, shape.block_size + 1), generator=g)
    return [(d[:, :-1].contiguous(), d[:, 1:].contiguous()) for d in data]


def load() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def race(steps: dict, data: list, iters: int, warmup: int) -> dict[str, list[float]]:
    names = list(steps)
    for i in range(warmup):
        for name in names:
            steps[name](*data[i % len(data)])
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(iters):
        order = names if i % 2 == 0 else names[::-1]
        for name in order:
            t0 = time.perf_counter()
            steps[name](*data[i % len(data)])
            times[name].append(time.perf_counter() - t0)
    return times


def print_curves(shape: Shape, batch: int, contenders: list[str], args: argparse.Namespace) -> None:
    """Train every contender `args.curve` steps from the same weights on the same batches and
    print the loss curves and each one's largest gap to nanoGPT's."""
    fresh = {f"sheepop {d}": sheepop_step(shape, batch, d, args.extra) for d in contenders}
    start = next(iter(fresh.values())).engine.weights()
    for step in fresh.values():
        step.engine.model.load_numpy_weights(start)
    if args.nanogpt:
        fresh["nanoGPT"] = reference_step(shape, args.nanogpt)  # (its own initial weights)
    else:
        model = ReferenceGPT(shape)
        load_sheepop_weights(model, start, shape.n_layer)
        fresh["nanoGPT"] = ReferenceStep(model.train())
    curves: dict[str, list[float]] = {name: [] for name in fresh}
    for x, y in batches(shape, batch, args.curve, seed=1):
        for name, step in fresh.items():
            curves[name].append(float(step(x, y)))
    every = max(1, args.curve // 10)
    base = np.array(curves["nanoGPT"])
    for name, c in curves.items():
        print(f"{name:<20} loss " + " ".join(f"{v:.3f}" for v in c[::every]) + f"  largest "
              f"|loss - nanoGPT's| {np.abs(np.array(c) - base).max():.4f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=SHAPES, default="reference")
    p.add_argument("--nanogpt", metavar="DIR", help="a nanoGPT checkout (its model.py)")
    p.add_argument("--sheepop", action="append", metavar="DTYPE[+compile]",
                   help="a sheepop contender: float32 or bfloat16, with +compile for "
                        "torch.compile (repeatable; default float32)")
    p.add_argument("--set", dest="extra", action="append", default=[],
                   help="a config override for sheepop's contenders (repeatable)")
    p.add_argument("--iters", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--floor", action="store_true",
                   help="also race the step's work kernels alone (step_floor.py): the floor "
                        "under any step made of torch's kernels")
    p.add_argument("--curve", type=int, default=0, metavar="N",
                   help="also train N steps each and print both loss curves")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    shape, batch = SHAPES[args.shape]
    print(f"{machine.summary()}; {args.threads} torch threads")
    print(f"shape {args.shape}: {shape}, batch {batch}; nanoGPT: "
          f"{args.nanogpt or 'the re-implementation'}")
    contenders = args.sheepop or ["float32"]
    steps = {"nanoGPT": reference_step(shape, args.nanogpt)}
    for contender in contenders:
        steps[f"sheepop {contender}"] = sheepop_step(shape, batch, contender, args.extra)
    if args.floor:
        steps["kernels alone"] = floor_step(shape, batch)
    data = batches(shape, batch, 8)
    times = race(steps, data, args.iters, args.warmup)
    ref = times["nanoGPT"]
    print(f"{'contender':<20} {'median ms':>10} {'ratio to nanoGPT':>17}")
    for name, t in times.items():
        ratio = statistics.median(a / b for a, b in zip(t, ref))
        print(f"{name:<20} {1000 * statistics.median(t):10.1f} {ratio:17.3f}")
    if args.curve:
        print_curves(shape, batch, contenders, args)
    print(f"load at the end {load()}")


if __name__ == "__main__":
    main()
