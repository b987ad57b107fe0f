"""What the hook points (docs/hooks.md) cost a decode step: nothing measurable without hooks.

    python benchmarks/hook_cost.py [--shape smollm2] [--steps 20] [--rounds 7] [--threads 1]
                                   [--before DIR]

On random weights of a shape of benchmarks/decode_shapes.py, after a 64-token prefill, the
median seconds of one greedy decode step in each engine:

    no hooks        the plain step: each layer finds no hooks (an attribute or a thread-local
                    read and a test for None at each point)
    hooks, none     inside `hooked(..., {})`: every point asks the empty set for its hook
    one observer    a hook reading blocks.L/2.resid_out (and keeping nothing)

With `--before DIR`, DIR a copy of the source tree before the hook points (`git archive
<commit> src | tar -x -C DIR`), its plain step runs too, in a second process on the same
weights, the two taking turns round by round (benchmarks/decode_shapes.alternate's order), so
the machine's load falls on both alike. One thread each by default (sheepop.threads): two
processes sharing a loaded machine's cores otherwise time each other's threads.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import timeit
from collections.abc import Callable

import numpy as np
from decode_shapes import build_models, prompt_ids, shape_config

from sheepop import threads

PROMPT = 64


def step_seconds(lm, steps: int, around=None) -> float:
    """The median seconds of `steps` decode steps after a fresh prefill, each inside `around()`
    (a context manager factory) when given."""
    token = int(np.argmax(lm.prefill(prompt_ids(lm_vocab(lm), PROMPT))))
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        if around is None:
            token = int(np.argmax(lm.decode(token)))
        else:
            with around():
                token = int(np.argmax(lm.decode(token)))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def lm_vocab(lm) -> int:
    return lm.cfg.vocab_size if hasattr(lm, "cfg") else lm.model.cfg.vocab_size


def hooked_around(engine: str, lm, hooks: dict):
    """A factory of `hooked` contexts for `lm`'s engine."""
    if engine == "numpy":
        from sheepop.scratch.hooks import hooked
        return lambda: hooked(lm.cfg, hooks)
    from sheepop.model.hooks import hooked
    return lambda: hooked(lm.model, hooks)


def contenders_for(engine: str, lm, steps: int, middle: str) -> dict[str, Callable[[], float]]:
    return {"no hooks": lambda: step_seconds(lm, steps),
            "hooks, none": lambda: step_seconds(lm, steps, hooked_around(engine, lm, {})),
            "one observer": lambda: step_seconds(
                lm, steps, hooked_around(engine, lm, {middle: lambda x, p: None}))}


def check_seconds(engine: str, lm) -> tuple[float, str]:
    """(the seconds a decode step spends finding that no hook is set, how they are counted).

    Counted from the code on the path without hooks: torch reads an attribute and tests it
    for None in the model (1 read, 3 tests), and per block in the block (1 and 1), the
    attention (2 and 4) and the feed-forward (1 and 1); NumPy reads the thread-local hooks
    once in gpt_forward and per block in the block, the attention, its core and the
    feed-forward (each a function call), and tests a local for None 3 times, and per block
    7 + 4 + 2 + 2 times. Each operation is timed alone (timeit, 10^6 times)."""
    n = 10 ** 6
    hooks = None
    test = timeit.timeit(lambda: hooks is not None, number=n) / n
    if engine == "numpy":
        from sheepop.scratch.hooks import block
        read, layers = timeit.timeit(block, number=n) / n, lm.cfg.n_layer
        reads, tests = 1 + 4 * layers, 3 + 15 * layers
    else:
        attention = lm.model.blocks[0].attn
        read, layers = timeit.timeit(lambda: attention.hooks, number=n) / n, lm.model.cfg.n_layer
        reads, tests = 1 + 4 * layers, 3 + 6 * layers
    return reads * read + tests * test, (f"{reads} reads of {read * 1e9:.0f} ns, {tests} "
                                         f"tests of {test * 1e9:.0f} ns")


def worker(shape: str, steps: int, count: int) -> None:
    """Answer each line "ENGINE" on stdin with the plain step's median seconds (the --before
    side: its tree may have no hooks at all)."""
    threads.apply(count)
    models = build_models(shape_config(shape), ["torch", "numpy"])
    print("ready", flush=True)
    for line in sys.stdin:
        print(json.dumps(step_seconds(models[line.strip()], steps)), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="smollm2")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--before", default=None)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args.shape, args.steps, args.threads)
    print(f"threads {threads.apply(args.threads)}, load average {threads.load_average():.1f}")
    cfg = shape_config(args.shape)
    models = build_models(cfg, ["torch", "numpy"])
    before = None
    if args.before:
        env = {**os.environ, "PYTHONPATH": os.path.join(args.before, "src")}
        before = subprocess.Popen([sys.executable, __file__, "--worker", "--shape", args.shape,
                                   "--steps", str(args.steps), "--threads", str(args.threads)],
                                  env=env, text=True,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert before.stdout.readline().strip() == "ready"
    middle = f"blocks.{cfg.model.n_layer // 2}.resid_out"
    for engine, lm in models.items():
        contenders = contenders_for(engine, lm, args.steps, middle)
        if before is not None:
            def earlier(engine=engine) -> float:
                before.stdin.write(engine + "\n")
                before.stdin.flush()
                return json.loads(before.stdout.readline())
            contenders["before the hook points"] = earlier
        times: dict[str, list[float]] = {name: [] for name in contenders}
        names = list(contenders)
        for r in range(args.rounds):
            for name in (names if r % 2 == 0 else names[::-1]):
                times[name].append(contenders[name]())
        plain = statistics.median(times["no hooks"])
        cost, counted = check_seconds(engine, lm)
        print(f"{engine:6s} finding no hooks: {cost * 1e6:.1f} us a step ({counted}) = "
              f"{cost / plain:.3%} of the step")
        for name, t in times.items():
            m = statistics.median(t)
            print(f"{engine:6s} {name:24s} {m * 1e3:8.2f} ms/step  ({m / plain - 1:+.1%}; "
                  f"rounds {min(t) * 1e3:.2f} .. {max(t) * 1e3:.2f})", flush=True)
    print(f"load average {threads.load_average():.1f}")
    if before is not None:
        before.stdin.close()
        before.wait()


if __name__ == "__main__":
    main()
