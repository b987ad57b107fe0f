"""The reference training step with bf16 autocast against nanoGPT's float32 step, on this CPU.

    python benchmarks/bf16_training.py                     # reference shape, 1 thread
    python benchmarks/bf16_training.py --threads 2 --iters 40 --compile --curve 100

Issue 31's target: sheepop's bf16 step <= 0.5x nanoGPT's float32 step *where the CPU has bf16
instructions* (torch.backends.cpu.get_cpu_capability() reporting AVX512_BF16 or AMX; torch
2.13 names only AVX512/AVX2 there, so torch.cpu's avx512_bf16 and amx_tile probes and oneDNN's
bf16 check are printed too). On a CPU without them a bf16 product is emulated: the script says
so, says that the target does not apply, and still prints the figures.

The step is vs_nanogpt.py's (the same contenders, batches and alternation: each iteration runs
every contender once, the order reversed every other time; medians of each and of the
per-iteration ratios to nanoGPT's); `--curve N` also prints the largest |loss - nanoGPT's| of N
steps from the same weights (the tolerance stated in docs/performance.md: 0.01).
"""

from __future__ import annotations

import argparse
import statistics

import machine
import torch
from vs_nanogpt import SHAPES, batches, load, print_curves, race, reference_step, sheepop_step


def bf16_instructions() -> dict[str, bool]:
    """What this CPU offers bf16 products, by every probe torch has."""
    return {"avx512_bf16": bool(torch.cpu._is_avx512_bf16_supported()),
            "amx_tile": bool(torch.cpu._is_amx_tile_supported()),
            "onednn_bf16": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=SHAPES, default="reference")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--compile", action="store_true", help="also race bfloat16+compile")
    p.add_argument("--curve", type=int, default=0, metavar="N")
    args = p.parse_args()
    args.extra, args.nanogpt = [], None
    torch.set_num_threads(args.threads)
    capability = torch.backends.cpu.get_cpu_capability()
    probes = bf16_instructions()
    native = capability in ("AVX512_BF16", "AMX") or probes["avx512_bf16"] or probes["amx_tile"]
    print(f"{machine.summary()}; " + ", ".join(f"{k} {v}" for k, v in probes.items())
          + f"; {args.threads} thread(s)")
    print("bf16 instructions: " + ("yes: the target (bf16 step <= 0.5x nanoGPT's float32) "
                                    "applies" if native else
                                    "NO: bf16 products are emulated here; the target "
                                    "(<= 0.5x) does not apply on this CPU"))
    shape, batch = SHAPES[args.shape]
    contenders = ["float32", "bfloat16"] + (["bfloat16+compile"] if args.compile else [])
    steps = {"nanoGPT float32": reference_step(shape, None)}
    for contender in contenders:
        steps[f"sheepop {contender}"] = sheepop_step(shape, batch, contender, [])
    times = race(steps, batches(shape, batch, 8), args.iters, args.warmup)
    ref = times["nanoGPT float32"]
    print(f"shape {args.shape}: {shape}, batch {batch}; {args.iters} iterations")
    print(f"{'contender':<26} {'median ms':>10} {'ratio to nanoGPT':>17}")
    for name, t in times.items():
        ratio = statistics.median(a / b for a, b in zip(t, ref))
        print(f"{name:<26} {1000 * statistics.median(t):10.1f} {ratio:17.3f}")
    if args.curve:
        print_curves(shape, batch, contenders, args)
    print(f"load at the end {load()}")


if __name__ == "__main__":
    main()
