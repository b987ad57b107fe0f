"""How close decoding comes to the memory-bandwidth bound: each engine's decode tokens/s as a
fraction of bandwidth / bytes of weights read per token, float32, 1 and 2 threads.

    nice python benchmarks/bandwidth_bound.py                         # smollm2 and gpt2 shapes
    nice python benchmarks/bandwidth_bound.py --shapes smollm2 --threads 1 --rounds 7

A decode step multiplies one token's vector by every weight matrix: ~2 flops per 4-byte weight
read, far below what the cores compute in the time memory takes to deliver it, so the step is
bound by reading the weights, and no engine decodes faster than

    bound = bandwidth / bytes read per token          (tokens/s)

with bandwidth this machine's read rate measured here at the same thread count, the fastest of
three readers of one `--gib` GiB float32 array: torch.sum (its intra-op threads), NumPy's sum
(one thread), and the BLAS matrix-vector product M v with the array as a row-major (R, 1024)
matrix M (OpenBLAS's threads). The product is the one that matters: at 2 threads it read 28.7
GB/s where torch.sum read 21.6 (2026-11-26 07:58 UTC), so a bound from the sums alone was 25%
too low, and the fractions it gave too high; and bytes per token from
benchmarks/decode_shapes.py (every weight once, the tied head reading the 49k x 576 or
50k x 768 embedding whole). The models are SmolLM2-135M's and GPT-2 small's shapes with
random weights: a decode step reads every weight whatever its value, so the speed is a trained
model's.

Per thread count the bandwidth and the two engines (greedy, `--new-tokens` after 16 tokens)
alternate `--rounds` times; medians are printed with the load average, the CPU capability
torch reports and the BLAS kernel threadpoolctl reports.

Also timed in each round: the NumPy step's matrix products alone, back to back (one token's
row times every weight matrix the NumPy engine holds, in its decode layout, the head's
included; nothing else). Their rate over the bound is the ceiling of any step built on those
BLAS calls: a step that did no other work at all would reach it and no more.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import decode_shapes as shapes
import machine
import numpy as np
import torch

from sheepop import threads

GIB = 2**30


def read_rates(array: np.ndarray, tensor: torch.Tensor) -> dict[str, float]:
    """Bytes/s of one full read of the same array: torch.sum (its threads), NumPy's sum, and
    the BLAS matrix-vector product over it as a row-major (R, 1024) matrix."""
    out, rows = {}, array.reshape(-1, 1024)
    v = np.ones(1024, dtype=array.dtype)
    for name, fn in (("torch sum", lambda: float(tensor.sum())),
                     ("numpy sum", lambda: float(array.sum())),
                     ("blas M v", lambda: rows @ v)):
        t0 = time.perf_counter()
        fn()
        out[name] = array.nbytes / (time.perf_counter() - t0)
    return out


def products_seconds(lm) -> float:
    """One token's products with every weight matrix the NumPy engine reads (`lm.params`, in
    its layout): the lookup tables left out, except a tied token table, which is the head."""
    params = lm.params
    mats = [w for name, w in params.items() if w.ndim == 2 and name != "pos_emb.weight"
            and not (name == "tok_emb.weight" and "head.weight" in params)]
    rows = {w.shape[1]: np.ones((1, w.shape[1]), dtype=w.dtype) for w in mats}
    t0 = time.perf_counter()
    for w in mats:
        rows[w.shape[1]] @ w.T
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["smollm2", "gpt2"],
                    choices=list(shapes.SHAPES))
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--new-tokens", type=int, default=33)
    ap.add_argument("--gib", type=float, default=1.0, help="the bandwidth array's size")
    args = ap.parse_args()
    array = np.ones(int(args.gib * GIB) // 4096 * 1024, dtype=np.float32)  # rows of 1024
    tensor = torch.from_numpy(array)  # the same memory
    threads.apply(args.threads[0])
    print(f"{machine.summary()}; float32, random weights, medians of {args.rounds} "
          "alternations")
    print("| shape | MB read/token | threads | bandwidth GB/s (torch sum / numpy sum / BLAS M v) "
          "| bound "
          "tok/s | numpy tok/s | numpy / bound | torch tok/s | torch / bound | numpy's products "
          "alone / bound | load |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for shape in args.shapes:
        cfg = shapes.shape_config(shape)
        models = shapes.build_models(cfg, ["numpy", "torch"])
        prompt = shapes.prompt_ids(cfg.model.vocab_size, 16)
        per_token = shapes.bytes_per_token(cfg, len(prompt) + args.new_tokens // 2)
        for n in args.threads:
            threads.apply(n)
            for lm in models.values():
                shapes.decode_seconds(lm, prompt, 3)
            rates: dict[str, list[float]] = {"torch sum": [], "numpy sum": [], "blas M v": []}
            decode: dict[str, list[float]] = {e: [] for e in models}
            products: list[float] = []
            for r in range(args.rounds):  # bandwidth, then the engines, in turn
                for name, rate in read_rates(array, tensor).items():
                    rates[name].append(rate)
                products.append(products_seconds(models["numpy"]))
                for e in (list(models) if r % 2 == 0 else list(models)[::-1]):
                    seconds, _ = shapes.decode_seconds(models[e], prompt, args.new_tokens)
                    decode[e].append((args.new_tokens - 1) / seconds)
            bw = {name: statistics.median(v) for name, v in rates.items()}
            bound = max(bw.values()) / per_token
            tok = {e: statistics.median(v) for e, v in decode.items()}
            print(f"| {shape} | {per_token / 1e6:.0f} | {n} | {bw['torch sum'] / 1e9:.1f} / "
                  f"{bw['numpy sum'] / 1e9:.1f} / {bw['blas M v'] / 1e9:.1f} | {bound:.1f} | "
                  f"{tok['numpy']:.1f} | "
                  f"{tok['numpy'] / bound:.2f} | {tok['torch']:.1f} | {tok['torch'] / bound:.2f} "
                  f"| {1 / statistics.median(products) / bound:.2f} | {os.getloadavg()[0]:.2f} |",
                  flush=True)
        del models


if __name__ == "__main__":
    main()
