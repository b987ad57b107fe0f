"""Time to a target loss: nanoGPT's recipe against sheepop's modern one, and an ablation.

    python benchmarks/speedrun.py                        # char scale, 3 seeds, 600 reference steps
    python benchmarks/speedrun.py --seeds 1 --steps 200  # a quick look
    python benchmarks/speedrun.py --ablation             # each piece of the recipe removed in turn

The reference is nanoGPT's recipe for its small character model, written here as settings of
sheepop's torch engine (its GPT-2 block: learned positions, LayerNorm, GELU MLP 4x, biases, tied
head; AdamW lr 1e-3, betas (0.9, 0.99), weight decay 0.1, warmup 100 then a cosine to 1e-4,
clip 1.0; benchmarks/vs_nanogpt.py shows the engine takes nanoGPT's steps at nanoGPT's speed).
It trains `--steps` steps; its last validation loss is the target L. sheepop's recipe (RoPE,
RMSNorm, QK-norm, ReLU^2, logit soft-capping, zero-initialised projections, Muon for the
blocks' matrices, warmup-stable-decay) then trains on the same data, the same shape and the same
batches with `train.target_val_loss = L`, evaluating every `--eval-every` steps, and the
summary's step and second are its time to L. The two alternate seed by seed, so a burst of load
on the shared machine lands on both; the figures are medians over the seeds with their spread,
and the load average is printed beside them.

Data: the char scale is ~1 MB of the Python standard library's source (nanoGPT's
shakespeare_char shape: 4 layers of 128 here, context 64, batch 12, the reference config of
benchmarks/vs_nanogpt.py), split 90/10. Every run evaluates on the same held-out windows.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import machine
import torch

from sheepop.config.build import build_config
from sheepop.config.schema import DataConfig
from sheepop.data.dataset import load_dataset
from sheepop.train.start import setup

SHAPE = ["model.n_layer=4", "model.n_head=4", "model.n_embd=128", "model.block_size=64",
         "model.dropout=0", "train.batch_size=12", "train.device=cpu", "train.dtype=float32",
         "train.grad_clip=1.0", "train.eval_batches=20", "train.log_interval=1000000",
         "train.checkpoint_interval=0", "data.tokenizer=char"]
REFERENCE = ["model.pos_encoding=learned", "model.norm=layernorm", "model.ffn=mlp",
             "model.activation=gelu", "model.bias=true", "model.tie_weights=true",
             "train.optimizer=adamw", "train.lr=1e-3", "train.min_lr=1e-4", "train.beta1=0.9",
             "train.beta2=0.99", "train.weight_decay=0.1", "train.warmup_steps=100",
             "train.schedule=cosine"]
# Each piece a setting, so the ablation removes one by putting back the reference's value.
RECIPE = {
    "rope": ["model.pos_encoding=rope"],
    "rmsnorm": ["model.norm=rmsnorm"],
    "qk_norm": ["model.qk_norm=true"],
    "relu2": ["model.activation=relu2"],
    "softcap": ["model.logit_softcap=15"],
    "zero_init": ["model.zero_init_proj=true"],
    "muon": ["train.optimizer=muon", "train.muon_lr=0.02"],
    "wsd": ["train.schedule=wsd", "train.cooldown=0.3", "train.lr=3e-3", "train.min_lr=3e-4"],
}
UNDO = {"rope": ["model.pos_encoding=learned"], "rmsnorm": ["model.norm=layernorm"],
        "qk_norm": ["model.qk_norm=false"], "relu2": ["model.activation=gelu"],
        "softcap": ["model.logit_softcap=0"], "zero_init": ["model.zero_init_proj=false"],
        "muon": ["train.optimizer=adamw"],
        "wsd": ["train.schedule=cosine", "train.lr=1e-3", "train.min_lr=1e-4"]}


def train(dataset, sets: list[str], steps: int, seed: int, eval_every: int,
          target: float = 0.0) -> dict:
    """One run in a scratch folder: its last val loss, and when it reached `target`."""
    cfg = build_config(None, None, [*SHAPE, *sets, f"train.steps={steps}", f"train.seed={seed}",
                                    f"train.eval_interval={eval_every}",
                                    f"train.target_val_loss={target}"])
    with tempfile.TemporaryDirectory() as tmp:
        trainer = setup(None, cfg, Path(tmp) / "run", dataset=dataset, progress=False,
                        log=lambda *_: None)
        t0 = time.perf_counter()
        summary = trainer.run()
        seconds = time.perf_counter() - t0
    reached = summary.reached
    return {"val": summary.val_loss, "steps": summary.steps, "seconds": seconds,
            "reached_step": reached[0] if reached else None,
            "reached_s": reached[1] if reached else None}


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    med = statistics.median(values)
    return f"{med:.1f} ({min(values):.1f}-{max(values):.1f})" if len(values) > 1 else f"{med:.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=600, help="the reference's steps")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--max-factor", type=float, default=1.5,
                    help="sheepop's recipe may take up to this many times the reference's steps")
    ap.add_argument("--ablation", action="store_true")
    ap.add_argument("--max-bytes", type=int, default=1_000_000)
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(machine.summary())
    dataset = load_dataset(None, DataConfig(tokenizer="char", max_bytes=args.max_bytes))
    print(f"data: {len(dataset.train):,} train and {len(dataset.val):,} val tokens, "
          f"{dataset.tokenizer.vocab_size} ids")
    recipe = [s for sets in RECIPE.values() for s in sets]
    variants = {"sheepop": recipe}
    if args.ablation:
        variants.update({f"without {name}": recipe + UNDO[name] for name in RECIPE})
    rows: dict[str, list[dict]] = {"reference": [], **{k: [] for k in variants}}
    cap = int(args.steps * args.max_factor)
    for seed in range(args.seeds):
        ref = train(dataset, REFERENCE, args.steps, seed, args.eval_every)
        rows["reference"].append(ref)
        print(f"seed {seed}: reference {args.steps} steps in {ref['seconds']:.1f} s, "
              f"val loss L = {ref['val']:.4f}  (load {os.getloadavg()[0]:.1f})", flush=True)
        for name, sets in variants.items():
            run = train(dataset, REFERENCE + sets, cap, seed, args.eval_every, ref["val"])
            rows[name].append(run)
            got = (f"reached L at step {run['reached_step']} in {run['reached_s']:.1f} s"
                   if run["reached_step"] else f"not in {cap} steps (val {run['val']:.4f})")
            print(f"  {name}: {got}", flush=True)
    ref_s = [r["seconds"] for r in rows["reference"]]
    print(f"\nreference: {args.steps} steps, {spread(ref_s)} s (median, range), "
          f"L = {statistics.median(r['val'] for r in rows['reference']):.4f}")
    print("| recipe | steps to L | x reference | seconds to L | x reference | reached |")
    print("|---|---|---|---|---|---|")
    for name in variants:
        done = [r for r in rows[name] if r["reached_step"]]
        steps = [r["reached_step"] for r in done]
        secs = [r["reached_s"] for r in done]
        ratio_steps = statistics.median(steps) / args.steps if steps else float("nan")
        ratio_s = statistics.median(secs) / statistics.median(ref_s) if secs else float("nan")
        print(f"| {name} | {spread(steps)} | {ratio_steps:.2f} | {spread(secs)} | "
              f"{ratio_s:.2f} | {len(done)}/{len(rows[name])} |")
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
