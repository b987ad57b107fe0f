"""Threads against load: ms per step at 1 and 2 threads, on a quiet machine and under load that
this script makes itself, with the threads waiting actively (the default) or passively.

    nice -n 10 python benchmarks/threads.py          # the table of docs/performance.md
    nice -n 10 python benchmarks/threads.py --loads 0 --waits default \\
        --work decode-torch:tiny --work decode-numpy:tiny --work decode-numpy:gpt2-small

Each figure is one fresh process (the thread pools and their wait policy are fixed when torch or
NumPy loads), which sets its threads through sheepop.threads and times one workload:

- train-torch, train-numpy: one training step (forward, backward, clipping, AdamW) of the
  reference config (4 layers x 4 heads x 128, block 64, batch 12, float32) through the engines'
  training adapters;
- decode-torch:PRESET, decode-numpy:PRESET: one KV-cache decode step at a preset's shape
  (random weights; vocabulary 65, 50257 for gpt2-small), after a one-token prompt.

"Load N" runs N busy loops (`while True: pass`, at this script's niceness, stopped after each
figure and bounded in time) beside the measured process. "passive" sets OMP_WAIT_POLICY=PASSIVE
(torch's GNU OpenMP threads sleep instead of spinning while they wait) and
OPENBLAS_THREAD_TIMEOUT=4 (OpenBLAS's threads sleep after 2^4 cycles instead of ~2^28), both read
when the libraries load. Settings take turns round by round (`--repeats`); the median of the
rounds is printed (t1/t2 > 1: two threads are faster), with the load average at the start, the
end and after each row.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time

import machine

WAITS = {"default": {}, "passive": {"OMP_WAIT_POLICY": "PASSIVE", "OPENBLAS_THREAD_TIMEOUT": "4"}}
WORK = ("train-torch", "train-numpy", "decode-torch:baby", "decode-numpy:baby")
REFERENCE = ["model.n_layer=4", "model.n_head=4", "model.n_embd=128", "model.block_size=64",
             "model.dropout=0", "model.vocab_size=65", "train.batch_size=12",
             "train.dtype=float32"]


# ----- the measured process -----------------------------------------------------------------
def _timed(step, seconds: float, warmup: int = 1) -> float:
    """Median ms of `step()` calls over about `seconds` (after `warmup` calls)."""
    for _ in range(warmup):
        step()
    times: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < 3:
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def _train_step(engine: str):
    import numpy as np

    from sheepop.config.build import build_config
    from sheepop.train.start import make_engine
    cfg = build_config(None, None, REFERENCE + [f"train.engine={engine}"])
    cfg.validate()
    eng = make_engine(cfg)
    rng = np.random.default_rng(0)
    B, T, V = cfg.train.batch_size, cfg.model.block_size, cfg.model.vocab_size
    batch = [(rng.integers(0, V, (B, T)), rng.integers(0, V, (B, T)))]
    return lambda: eng.train_step(batch, 1e-3)


def _decode_step(engine: str, preset: str):
    import dataclasses

    from sheepop.config.build import build_config
    from sheepop.inference.load import build
    from sheepop.scratch.init import init_params
    cfg = build_config(preset)
    vocab = 50257 if preset.startswith("gpt2") else 65
    cfg.model = dataclasses.replace(cfg.model, vocab_size=vocab, dropout=0.0)
    lm = build(cfg, init_params(cfg.model, seed=0), engine=engine, device="cpu").lm
    n = min(64, cfg.model.block_size - 1)
    state = {"left": 0}

    def step() -> None:
        if state["left"] == 0:  # a fresh sequence every n tokens: the cache never fills
            lm.prefill([1])
            state["left"] = n
        lm.decode(2)
        state["left"] -= 1
    return step


def child(work: str, threads: int, seconds: float) -> None:
    from sheepop import threads as sheepop_threads
    sheepop_threads.apply(threads)
    kind, _, preset = work.partition(":")
    step = (_train_step(kind.split("-")[1]) if kind.startswith("train")
            else _decode_step(kind.split("-")[1], preset))
    print(f"{_timed(step, seconds):.3f} {sheepop_threads.describe()}")


# ----- the driver ---------------------------------------------------------------------------
def busy_loops(n: int, seconds: float) -> list[subprocess.Popen]:
    code = f"import time\nend = time.time() + {seconds}\nwhile time.time() < end: pass"
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(n)]


def measure(work: str, threads: int, wait: str, load: int, seconds: float) -> float:
    env = {**os.environ, **WAITS[wait]}
    env.pop("OMP_NUM_THREADS", None)
    loops = busy_loops(load, seconds + 60)
    try:
        out = subprocess.run([sys.executable, __file__, "--child", work, str(threads),
                              str(seconds)], env=env, capture_output=True, text=True,
                             timeout=seconds * 20 + 120, check=True).stdout
    finally:
        for p in loops:
            p.kill()
            p.wait()
    return float(out.split()[0])


def uptime() -> str:
    return "load average {:.2f}, {:.2f}, {:.2f}".format(*os.getloadavg())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", action="append", help=f"workload (repeatable; default: "
                   f"{', '.join(WORK)})")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--loads", type=int, nargs="+", default=[0, 1, 2],
                   help="busy loops beside the measured process")
    p.add_argument("--waits", nargs="+", default=list(WAITS), choices=list(WAITS))
    p.add_argument("--seconds", type=float, default=3.0, help="timed seconds per figure")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), float(args.child[2]))
        return
    # A SIGTERM stops the driver through its `finally`s: the busy loops and the child go too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    print(f"start: {machine.summary()}", flush=True)
    works = args.work or list(WORK)
    print(f"{'workload':<24} {'load':>4} {'wait':>8} "
          + " ".join(f"{f'{t} thr ms':>10}" for t in args.threads)
          + f" {'t1/t2':>9}  load avg", flush=True)
    for load in args.loads:
        for work in works:
            for wait in args.waits:
                runs: dict[int, list[float]] = {t: [] for t in args.threads}
                for _ in range(args.repeats):
                    for t in args.threads:
                        runs[t].append(measure(work, t, wait, load, args.seconds))
                ms = {t: statistics.median(v) for t, v in runs.items()}
                ratio = (f"{ms[1] / ms[2]:9.2f}" if 1 in ms and 2 in ms else " " * 9)
                print(f"{work:<24} {load:>4} {wait:>8} "
                      + " ".join(f"{ms[t]:10.2f}" for t in args.threads)
                      + f" {ratio}  {os.getloadavg()[0]:.2f}", flush=True)
    print(f"end: {uptime()}")


if __name__ == "__main__":
    main()
