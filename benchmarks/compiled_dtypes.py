"""Eager against `torch.compile` (inductor's generated C++), per weight dtype: SmolLM2-135M's
shape with random weights, one decode step at a time, as `sheepop generate --compile` runs it.

    python benchmarks/compiled_dtypes.py                       # 30 layers: minutes of compiling
    python benchmarks/compiled_dtypes.py --layers 4 --dtypes int8 --repeats 5
    python benchmarks/compiled_dtypes.py --inductor freezing=True

For each `--dtypes` (the torch engine's `--dtype`: sheepop.inference.load.build) an eager model
and a compiled one (TorchLM.compile: `torch.compile(dynamic=True)`) on the same weights. Printed:

- compile: seconds of the compiled model's first prefill and first 3 decode steps (eager's
  take well under a second), and what dynamo did: frames compiled, graph breaks (with their
  reasons: a graph break inside a block costs a frame per layer, and those past dynamo's
  recompile limit run eagerly), recompilations;
- decode tokens/s, median of `--repeats` rounds in which every model decodes `--new-tokens`
  greedy tokens after a `--prompt-tokens`-token prompt, the contenders taking turns (the order
  reversed every other round: decode_shapes.alternate); the load average before and after;
- the bound: read bandwidth (a `--bandwidth-mib` array read by the fastest of
  bandwidth_bound.py's readers on the same thread, weight_dtypes.read_bandwidth) over the
  bytes one decode step reads in that dtype (sheepop.model.quantized.weight_bytes_read), and
  tokens/s as a fraction of it;
- whether the compiled model's greedy tokens equal the eager one's.

`--inductor KEY=VALUE` sets `torch._inductor.config.KEY` before anything compiles (a value is
a Python literal), to measure a knob without editing the code; TorchLM.compile's own options
(`realize_opcount_threshold=1`) win over it. Random weights decode at the speed trained ones do
(decode_shapes); the real model's figures: benchmarks/weight_dtypes.py.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import machine  # noqa: E402
from decode_shapes import alternate, decode_seconds, prompt_ids, shape_config  # noqa: E402
from weight_dtypes import read_bandwidth  # noqa: E402

from sheepop import threads  # noqa: E402
from sheepop.inference.load import build  # noqa: E402
from sheepop.scratch.init import init_params  # noqa: E402

DTYPES = ("float32", "bfloat16", "int8", "int4")


def set_inductor(settings: list[str]) -> None:
    import torch._inductor.config as inductor
    for setting in settings:
        key, _, value = setting.partition("=")
        owner, *path, last = [inductor, *key.split(".")]
        for part in path:
            owner = getattr(owner, part)
        if not hasattr(owner, last):
            sys.exit(f"torch._inductor.config has no {key}")
        setattr(owner, last, ast.literal_eval(value))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16", "int8"],
                    choices=DTYPES)
    ap.add_argument("--layers", type=int, default=30, help="SmolLM2 has 30")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--bandwidth-mib", type=int, default=512)
    ap.add_argument("--inductor", nargs="*", default=[], metavar="KEY=VALUE")
    args = ap.parse_args()

    threads.apply(args.threads)
    from torch._dynamo.utils import counters

    from sheepop.model.quantized import weight_bytes_read
    set_inductor(args.inductor)
    cfg = shape_config("smollm2")
    cfg.model.n_layer = args.layers
    weights = init_params(cfg.model, 0)
    ids = prompt_ids(cfg.model.vocab_size, args.prompt_tokens)
    print(f"machine: {machine.summary()}; {args.threads} thread(s); SmolLM2's shape, "
          f"{args.layers} layers; inductor settings: TorchLM.compile's "
          f"{' '.join(args.inductor)}")

    models, nbytes = {}, {}
    for dtype in args.dtypes:
        for compiled in (False, True):
            name = f"{dtype}{' compiled' if compiled else ''}"
            lm = build(cfg, weights, None, "torch", "cpu", dtype, compiled).lm
            before = Counter(counters["stats"])
            breaks = Counter(counters["graph_break"])
            t0 = time.perf_counter()
            decode_seconds(lm, ids, 4)
            if compiled:
                stats = Counter(counters["stats"]) - before
                reasons = Counter(counters["graph_break"]) - breaks
                print(f"{name}: first prefill + 3 decode steps {time.perf_counter() - t0:.1f} s; "
                      f"frames compiled {stats['unique_graphs']}, graph breaks "
                      f"{sum(reasons.values())}")
                for reason, n in reasons.most_common(3):
                    print(f"    {n} x {reason.splitlines()[0][:150]}")
            models[name], nbytes[name] = lm, weight_bytes_read(lm.model)

    load_before = os.getloadavg()[0]
    bandwidth = read_bandwidth(args.bandwidth_mib)
    tokens: dict[str, list[int]] = {}

    def contender(name):
        def step() -> float:
            seconds, tokens[name] = decode_seconds(models[name], ids, args.new_tokens)
            return seconds
        return step

    seconds = alternate({name: contender(name) for name in models}, args.repeats)
    print(f"\nread bandwidth {bandwidth / 1e9:.2f} GB/s; load average {load_before:.2f} -> "
          f"{os.getloadavg()[0]:.2f}; decode {args.new_tokens} greedy tokens after {len(ids)}, "
          f"median of {args.repeats}")
    print(f"{'model':<18} {'MB/token':>8} {'bound tok/s':>11} {'tok/s':>7} {'of bound':>8} "
          f"{'vs eager':>8}  greedy tokens")
    for name, s in seconds.items():
        speed = (args.new_tokens - 1) / s
        bound = bandwidth / nbytes[name]
        eager = name.removesuffix(" compiled")
        ratio = seconds[eager] / s
        same = (sum(a == b for a, b in zip(tokens[name], tokens[eager])) if name != eager
                else None)
        print(f"{name:<18} {nbytes[name] / 1e6:>8.1f} {bound:>11.1f} {speed:>7.1f} "
              f"{speed / bound:>8.2f} {ratio:>7.2f}x  "
              f"{'' if same is None else f'{same} of {args.new_tokens} as eager'}")


if __name__ == "__main__":
    main()
