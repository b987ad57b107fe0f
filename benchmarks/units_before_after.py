"""Training-step time of both engines, two source trees side by side (issue 29's restructure).

    git archive a36cec4 src | tar -x -C /tmp/before
    .venv/bin/python benchmarks/units_before_after.py /tmp/before/src src [--rounds 3]

Each (tree, engine, setting) is timed in its own process (`--child`), the trees taking turns
round after round, so that a change in the machine's load affects both alike; printed: the
median over rounds of each process's median ms per optimizer step (forward, backward,
clipping, AdamW, through the training-loop adapters), float32, dropout 0. Settings: a full
step, a LoRA step (rank 8 on every target, 3 new tokens' rows), and a progression model
(digit places + term indices, rope_places) — the three paths the restructure moved.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

MODEL = dict(vocab_size=96, block_size=128, n_layer=4, n_head=4, n_embd=128, dropout=0.0)
BATCH = 16
SETTINGS = {
    "full": {},
    "lora": {},
    "digits": dict(vocab_size=16, pos_encoding="rope_places", digit_positions=12,
                   term_positions=8),
}


def child(engine: str, setting: str, steps: int, warmup: int) -> float:
    """Median seconds per step of one engine on one setting, in this process."""
    import numpy as np

    from sheepop.arch.lora import LoraConfig
    from sheepop.config.schema import ModelConfig, TrainConfig
    cfg = ModelConfig(**{**MODEL, **SETTINGS[setting]})
    lora = LoraConfig(8, 16.0, new_tokens=3) if setting == "lora" else None
    tcfg = TrainConfig(device="cpu", dtype="float32", grad_clip=1.0)
    if engine == "numpy":
        from sheepop.train.engine_numpy import NumpyEngine as Engine
    else:
        from sheepop.train.engine_torch import TorchEngine as Engine
    from sheepop.scratch.init import init_params
    weights = init_params(cfg, 0, np.float32)
    eng = Engine(cfg, tcfg, weights, lora)
    rng = np.random.default_rng(0)
    batches = [(rng.integers(0, cfg.vocab_size, (BATCH, cfg.block_size)),
                rng.integers(0, cfg.vocab_size, (BATCH, cfg.block_size))) for _ in range(4)]
    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        eng.train_step([batches[i % 4]], 1e-3)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trees", nargs="*", help="src directories to compare (before, after)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--child", nargs=2, metavar=("ENGINE", "SETTING"))
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(*args.child, args.steps, args.warmup)))
        return
    runs = [(e, s) for s in SETTINGS for e in ("numpy", "torch")]
    results: dict[tuple[str, str, str], list[float]] = {}
    for _ in range(args.rounds):
        for engine, setting in runs:
            for tree in args.trees:
                env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
                out = subprocess.run([sys.executable, __file__, "--child", engine, setting,
                                      "--steps", str(args.steps), "--warmup", str(args.warmup)],
                                     env=env, capture_output=True, text=True, check=True)
                results.setdefault((tree, engine, setting), []).append(json.loads(out.stdout))
    print(f"{os.cpu_count()} CPUs, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
          f"; model {MODEL}, batch {BATCH}; ms per step, median of {args.rounds} rounds")
    print(f"{'engine':8}{'setting':9}" + "".join(f"{t[-28:]:>30}" for t in args.trees))
    for engine, setting in runs:
        row = [statistics.median(results[(t, engine, setting)]) * 1e3 for t in args.trees]
        print(f"{engine:8}{setting:9}" + "".join(f"{ms:30.1f}" for ms in row))


if __name__ == "__main__":
    main()
