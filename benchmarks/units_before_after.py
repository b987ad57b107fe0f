"""Training-step time of both engines, two source trees side by side (issue 29's restructure).

    git archive a36cec4 src | tar -x -C /tmp/before
    .venv/bin/python benchmarks/units_before_after.py /tmp/before/src src [--rounds 3]

Each (tree, engine, setting) is timed in its own process (`--child`), the trees taking turns
round after round, so that a change in the machine's load affects both alike; printed: the
median over rounds of each process's median ms per optimizer step (forward, backward,
clipping, AdamW, through the training-loop adapters), float32, dropout 0, one thread per
process (BLAS and torch), so that two processes of a shared machine do not fight. Settings: a full
step, a LoRA step (rank 8 on every target, 3 new tokens' rows), and a progression model
(digit places + term indices, rope_places) — the three paths the restructure moved — and a
LoRA step on a wider model (`--setting lora-wide`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import machine

MODEL = dict(vocab_size=96, block_size=128, n_layer=4, n_head=4, n_embd=128, dropout=0.0)
BATCH = 8
SETTINGS = {
    "full": {},
    "lora": {},
    "digits": dict(vocab_size=16, pos_encoding="rope_places", digit_positions=12,
                   term_positions=8),
    # LoRA where the linear layers and the head dominate: 6x wider, an 8,192-token vocabulary
    "lora-wide": dict(vocab_size=8192, n_embd=384, n_head=6),
}


def child(engine: str, setting: str, steps: int, warmup: int) -> float:
    """Median seconds per step of one engine on one setting, in this process."""
    import numpy as np
    import torch

    torch.set_num_threads(1)
    from sheepop.arch.lora import LoraConfig
    from sheepop.config.finetune import LORA_TARGETS
    from sheepop.config.schema import ModelConfig, TrainConfig
    cfg = ModelConfig(**{**MODEL, **SETTINGS[setting]})
    lora = LoraConfig(8, 16.0, LORA_TARGETS, new_tokens=3) if setting.startswith("lora") else None
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
    ap.add_argument("--setting", choices=list(SETTINGS), action="append",
                    help="settings to run (default: all)")
    ap.add_argument("--child", nargs=2, metavar=("ENGINE", "SETTING"))
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(*args.child, args.steps, args.warmup)))
        return
    runs = [(e, s) for s in args.setting or SETTINGS for e in ("numpy", "torch")]
    results: dict[tuple[str, str, str], list[float]] = {}
    for done in range(1, args.rounds + 1):
        for engine, setting in runs:
            for tree in args.trees:
                env = {**os.environ, "PYTHONPATH": os.path.abspath(tree),
                       **{v: "1" for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                           "MKL_NUM_THREADS")}}
                out = subprocess.run([sys.executable, __file__, "--child", engine, setting,
                                      "--steps", str(args.steps), "--warmup", str(args.warmup)],
                                     env=env, capture_output=True, text=True, check=True)
                results.setdefault((tree, engine, setting), []).append(json.loads(out.stdout))
        report(results, runs, args.trees, done)


def report(results: dict, runs: list[tuple[str, str]], trees: list[str], rounds: int) -> None:
    """The table after `rounds` rounds (printed after each, so a stopped run still reports)."""
    print(f"{machine.summary()}; base model {MODEL}, batch {BATCH}; ms per step, median of "
          f"{rounds} rounds")
    for setting in dict.fromkeys(s for _, s in runs):
        print(f"  {setting}: {SETTINGS[setting] or 'the base model'}")
    print(f"{'engine':8}{'setting':9}" + "".join(f"{t[-28:]:>30}" for t in trees))
    for engine, setting in runs:
        row = [statistics.median(results[(t, engine, setting)]) * 1e3 for t in trees]
        print(f"{engine:8}{setting:9}" + "".join(f"{ms:30.1f}" for ms in row), flush=True)


if __name__ == "__main__":
    main()
