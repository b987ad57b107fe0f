"""One decode token's matrix products in SmolLM2-135M's shapes, by weight format and library.

    python benchmarks/weight_kernels.py --threads 1 --repeats 5

What a decode step costs beyond attention: every linear layer's product with one token's row
(30 layers of qkv 960 x 576, output 576 x 576, gate and up 1536 x 576, down 576 x 1536) and the
head (49,152 x 576), each matrix its own memory (no cache reuse between them, as in the
model). Random weights; the formats:

- numpy float32: `x @ W.T`, as the NumPy engine multiplies, each W in the decode layout
  (sheepop.arch.layout: column-major where out >= in; OpenBLAS sgemv);
- numpy int8 by blocks: each block of `--block` rows converted to float32, then `x @ B.T`, the
  result scaled per row: the only int8 product NumPy has (no int8 BLAS) -- the candidate for a
  NumPy int8 engine;
- torch float32 (the same decode layout), torch bfloat16, torch int8
  (`_weight_int8pack_mm`, bf16 input), torch 4-bit groups (`_weight_int4pack_mm_for_cpu`).

The formats take turns, `--repeats` times; printed: the median ms per token, the bytes read and
GB/s. No model, so no quality: benchmarks/weight_dtypes.py measures that.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import machine
import numpy as np
import torch

from sheepop import threads
from sheepop.arch.layout import column_major

D, FF, QKV, V, LAYERS = 576, 1536, 960, 49152, 30


def shapes() -> list[tuple[int, int]]:
    return [(QKV, D), (D, D), (FF, D), (FF, D), (D, FF)] * LAYERS + [(V, D)]


def int8_rows(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    s = np.abs(w).max(axis=1) / 127
    return np.rint(w / s[:, None]).astype(np.int8), s.astype(np.float32)


def contenders(block: int):
    rng = np.random.default_rng(0)
    mats = [rng.standard_normal(s, dtype=np.float32) * 0.05 for s in shapes()]
    x = rng.standard_normal((1, D), dtype=np.float32)
    xs = {w.shape[1]: x if w.shape[1] == D else rng.standard_normal((1, FF), dtype=np.float32)
          for w in mats}
    q8 = [int8_rows(w) for w in mats]
    tx = {k: torch.from_numpy(v) for k, v in xs.items()}
    tb = {k: v.bfloat16() for k, v in tx.items()}
    # the decode layout of both engines (sheepop.arch.layout), copies
    laid = [np.asfortranarray(w) if column_major(w.shape) else w for w in mats]
    col = [torch.from_numpy(w) for w in laid]
    bf = [torch.from_numpy(w).bfloat16() for w in mats]
    t8 = [(torch.from_numpy(q), torch.from_numpy(s).bfloat16()) for q, s in q8]
    t4 = []
    for w in mats:
        g = torch.from_numpy(w).reshape(w.shape[0], -1, 32)
        lo, hi = g.amin(-1), g.amax(-1)
        d = (hi - lo) / 15
        q = ((g - lo[..., None]) / d[..., None]).round().clamp(0, 15).to(torch.int32)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.reshape(w.shape), 1)
        sz = torch.stack([d.t(), (lo + 8 * d).t()], -1).bfloat16().contiguous()
        t4.append((packed, sz))

    def numpy_f32():
        for w in laid:
            xs[w.shape[1]] @ w.T

    def numpy_int8():
        for q, s in q8:
            x_ = xs[q.shape[1]]
            y = np.empty((1, q.shape[0]), np.float32)
            for i in range(0, q.shape[0], block):
                y[:, i:i + block] = x_ @ q[i:i + block].astype(np.float32).T
            y *= s

    def torch_f32():
        for w in col:
            torch.nn.functional.linear(tx[w.shape[1]], w)

    def torch_bf16():
        for w in bf:
            torch.nn.functional.linear(tb[w.shape[1]], w)

    def torch_int8():
        for q, s in t8:
            torch.ops.aten._weight_int8pack_mm(tb[q.shape[1]], q, s)

    def torch_int4():
        for (packed, sz), (q, _) in zip(t4, t8):
            torch.ops.aten._weight_int4pack_mm_for_cpu(tb[q.shape[1]], packed, 32, sz)

    n = sum(a * b for a, b in shapes())
    return {"numpy float32": (numpy_f32, 4 * n),
            f"numpy int8, blocks of {block}": (numpy_int8, n + 4 * sum(s[0] for s in shapes())),
            "torch float32": (torch_f32, 4 * n), "torch bfloat16": (torch_bf16, 2 * n),
            "torch int8": (torch_int8, n + 2 * sum(s[0] for s in shapes())),
            "torch 4-bit groups": (torch_int4, n // 2 + 4 * n // 32)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--block", type=int, default=128)
    args = ap.parse_args()
    runs = contenders(args.block)
    print(machine.summary())
    for n in args.threads:
        threads.apply(n)
        before = os.getloadavg()[0]
        times: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(args.repeats):
            for name, (fn, _) in runs.items():
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
        print(f"\n{n} thread(s), load average {before:.2f} -> {os.getloadavg()[0]:.2f}, "
              f"median of {args.repeats}")
        print(f"{'format':<28} {'ms/token':>9} {'MB read':>8} {'GB/s':>6}  runs (ms)")
        for name, (_, nbytes) in runs.items():
            t = statistics.median(times[name])
            shown = " ".join(f"{1e3 * v:.0f}" for v in times[name])
            print(f"{name:<28} {1e3 * t:>9.1f} {nbytes / 1e6:>8.0f} {nbytes / t / 1e9:>6.2f}  "
                  f"{shown}")


if __name__ == "__main__":
    main()
