"""Muon's step against AdamW's, in both engines: the orthogonalisation's cost.

    python benchmarks/muon_step.py                 # the speedrun's shape (4 x 128, block 64)
    python benchmarks/muon_step.py --shape tiny-llama --iters 30

Each iteration times one optimizer step (forward, backward, clipping, update) of each contender
on the same batch, the order alternating, so a burst of load lands on all; the figure is the
median step time and Muon's over AdamW's, per engine. Target (issue 42): Muon's step <= 1.15x
AdamW's. The torch engine's Muon runs its Newton-Schulz iteration in bfloat16 where the CPU has
bf16 instructions and in float32 elsewhere (train.muon_ns_dtype = auto); `--ns-dtype` forces
one. `--dtype bfloat16` trains under bf16 autocast, as the speedrun does on such a CPU.

    python benchmarks/muon_step.py --shape speedrun-bpe --iters 8 --threads 1 --dtype bfloat16
    python benchmarks/muon_step.py --shape speedrun-bpe --batch-size 16   # twice the tokens
"""

from __future__ import annotations

import argparse
import statistics
import time

import machine
import numpy as np
import torch

from sheepop.config.build import build_config
from sheepop.train.engine_numpy import NumpyEngine
from sheepop.train.engine_torch import TorchEngine

SHAPES = {
    "speedrun": ["model.n_layer=4", "model.n_head=4", "model.n_embd=128", "model.block_size=64",
                 "train.batch_size=12", "model.vocab_size=100"],
    "tiny-llama": ["model.n_layer=4", "model.n_head=4", "model.n_kv_head=2", "model.n_embd=128",
                   "model.d_ff=384", "model.block_size=128", "model.pos_encoding=rope",
                   "model.norm=rmsnorm", "model.ffn=swiglu", "model.activation=silu",
                   "model.bias=false", "model.tie_weights=false", "train.batch_size=16",
                   "model.vocab_size=100"],
    # benchmarks/speedrun.py's BPE scale: ~12M parameters, 2,048 tokens a step.
    "speedrun-bpe": ["model.n_layer=6", "model.n_head=6", "model.n_embd=384",
                     "model.block_size=256", "train.batch_size=8", "model.vocab_size=4096"],
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=SHAPES, default="speedrun")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ns-dtype", choices=["auto", "bfloat16", "float32"], default="auto")
    ap.add_argument("--engines", default="torch,numpy")
    ap.add_argument("--batch-size", type=int, default=0,
                    help="sequences a step (0: the shape's); the iteration costs as the "
                         "parameters do, the step as the tokens do")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                    help="the torch engine's training dtype (bfloat16: autocast, as the "
                         "speedrun trains where the CPU has bf16 instructions); NumPy: float32")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(machine.summary())
    sized = [f"train.batch_size={args.batch_size}"] if args.batch_size else []
    shape = [*SHAPES[args.shape], *sized]
    contenders = {}
    for engine in args.engines.split(","):
        for optimizer in ("adamw", "muon"):
            dtype = args.dtype if engine == "torch" else "float32"
            cfg = build_config(None, None, [*shape, "train.device=cpu",
                                            f"train.dtype={dtype}", "model.dropout=0",
                                            f"train.optimizer={optimizer}",
                                            f"train.muon_ns_dtype={args.ns_dtype}"])
            kind = TorchEngine if engine == "torch" else NumpyEngine
            contenders[f"{engine} {optimizer}"] = kind(cfg.model, cfg.train)
    m = build_config(None, None, shape)
    rng = np.random.default_rng(0)
    x = rng.integers(0, 100, (m.train.batch_size, m.model.block_size))
    batch = [(x, np.roll(x, -1, axis=1))]
    times: dict[str, list[float]] = {name: [] for name in contenders}
    names = list(contenders)
    for name in names:  # one warm-up step each
        contenders[name].train_step(batch, 1e-3)
    for i in range(args.iters):
        for name in (names if i % 2 == 0 else names[::-1]):
            t0 = time.perf_counter()
            contenders[name].train_step(batch, 1e-3)
            times[name].append(time.perf_counter() - t0)
    for engine in args.engines.split(","):
        adamw = statistics.median(times[f"{engine} adamw"]) * 1e3
        muon = statistics.median(times[f"{engine} muon"]) * 1e3
        extra = ""
        if engine == "torch":
            ns_dtype = contenders["torch muon"].optimizers[1].ns_dtype or torch.float32
            extra = f" (the iteration in {str(ns_dtype).replace('torch.', '')})"
        print(f"{engine}: AdamW {adamw:.1f} ms, Muon {muon:.1f} ms{extra}: "
              f"{muon / adamw:.2f}x")


if __name__ == "__main__":
    main()
