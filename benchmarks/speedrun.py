"""Time to a target loss: nanoGPT's recipe against sheepop's modern one, and an ablation.

    python benchmarks/speedrun.py                        # char scale, 3 seeds, 300 reference steps
    python benchmarks/speedrun.py --seeds 1 --steps 200  # a quick look
    python benchmarks/speedrun.py --ablation             # each piece of the recipe removed in turn
    python benchmarks/speedrun.py --extras               # each piece left out of it added
    python benchmarks/speedrun.py --also train.muon_ns_steps=3   # the recipe with a setting
    python benchmarks/speedrun.py --scale bpe            # ~12M parameters, BPE, the whole corpus
    python benchmarks/speedrun.py --scale bpe --step-parts   # the step alone, piece by piece

The reference is nanoGPT's own recipe written here as nanoGPT's code does it
(benchmarks/nanogpt_reference.py: its GPT-2 block with learned positions, LayerNorm, a GELU MLP
4x, biases and a tied head; its AdamW with weight decay on the matrices, lr 1e-3, betas
(0.9, 0.99), decay 0.1; its schedule, a 100-step warmup then a cosine to 1e-4; clipping at 1.0:
config/train_shakespeare_char.py's settings). It trains `--steps` steps; its last validation
loss is the target L. sheepop's recipe (RoPE, RMSNorm, QK-norm, ReLU^2, logit soft-capping,
zero-initialised projections, Muon with momentum 0.9 for the blocks' matrices,
warmup-stable-decay) then trains with `train.target_val_loss = L`, evaluating every
`--eval-every` steps, and the summary's step and second are its time to L. Both draw the
same batches (sheepop's window sampler, same seed) and are measured on the same held-out
windows; both count their evaluations in their time. The two alternate seed by seed, so a burst
of load on the shared machine lands on both; the figures are medians over the seeds with their
spread, and the load average is printed beside them.
Within a seed the reference runs first (its loss is the target); with `--reference-after` it
runs again after the recipes and its time is the mean of the two, so that a change in the
machine's speed between them moves both sides alike.

`--budget S [S ...]` measures by modded-nanogpt's rule instead: the recipe trains exactly S steps
(its schedule, warmup-stable-decay, fitted to those S, so its cool-down ends at S) and is
evaluated once, at the end; it reaches L if that loss is at or below L, and its time is the whole
run's. The reference then evaluates once too, at its end, so neither side pays for evaluations
the other skips. A user who knows the budget trains so; one who does not stops at the target.

Scales: `char` is ~1 MB of the Python standard library's source by character (nanoGPT's
shakespeare_char "baby" shape scaled to a 2-core CPU: 4 layers of 128, context 64, batch 12);
`bpe` is the whole built-in corpus (the standard library's source without its tests: 11.4 MB on
Python 3.11) through a 4,096-id BPE, 6 layers of 384 with 6 heads (~12M parameters), context
256, batch 8. Where the CPU has bf16 instructions (AVX512_BF16 or AMX) both train under bf16
autocast; elsewhere float32 (a bf16 product is emulated there, tens of times slower).

`--step-parts` trains nothing: it times one training step (forward, backward, clipping, update)
of nanoGPT's recipe, of sheepop's, and of sheepop's without each of its pieces in turn, on the
same batch, taking turns with the order reversed every other round; each round's times are
divided by that round's nanoGPT step (ratios taken side by side), then the median over the
rounds, by the wall clock and by the process's CPU time (on a shared core the wall clock counts
the other work's turns too). What the recipe's step costs beyond nanoGPT's, and which piece.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import machine
import nanogpt_reference as nanogpt
import numpy as np
import torch
import torch.nn.functional as F

from sheepop.arch import IGNORE_INDEX
from sheepop.config.build import build_config
from sheepop.config.schema import DataConfig
from sheepop.data.dataset import Dataset, load_dataset
from sheepop.data.windows import WindowSampler, eval_windows
from sheepop.train.allocator import keep_freed_memory
from sheepop.train.engine_torch import TorchEngine, native_bf16
from sheepop.train.start import setup


@dataclass
class Scale:
    shape: dict[str, int]
    data: DataConfig
    steps: int
    eval_every: int


SCALES = {
    "char": Scale({"n_layer": 4, "n_head": 4, "n_embd": 128, "block_size": 64, "batch_size": 12},
                  DataConfig(tokenizer="char", max_bytes=1_000_000), steps=300, eval_every=25),
    "bpe": Scale({"n_layer": 6, "n_head": 6, "n_embd": 384, "block_size": 256, "batch_size": 8},
                 DataConfig(tokenizer="bpe", vocab_size=4096, max_bytes=20_000_000),
                 steps=200, eval_every=20),
}
COMMON = ["model.dropout=0", "train.device=cpu", "train.grad_clip=1.0", "train.eval_batches=20",
          "train.log_interval=1000000", "train.checkpoint_interval=0"]
# nanoGPT's recipe as settings of sheepop's torch engine: the base the recipe's pieces go on, so
# that the ablation takes one away by putting back nanoGPT's value.
NANOGPT = ["model.pos_encoding=learned", "model.norm=layernorm", "model.ffn=mlp",
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
    # Muon's momentum 0.9, not torch's 0.95: a run of ~60-80 steps wants a shorter memory
    # (docs/speedrun.md, "By modded-nanogpt's rule")
    "muon": ["train.optimizer=muon", "train.muon_lr=0.02", "train.muon_momentum=0.9"],
    "wsd": ["train.schedule=wsd", "train.cooldown=0.3", "train.lr=3e-3", "train.min_lr=3e-4"],
    "no_warmup": ["train.warmup_steps=0"],
}
# Pieces measured and left out of the recipe (docs/speedrun.md): `--extras` adds each in turn.
# Under Muon, train.lr is the learning rate of what AdamW keeps: embeddings, head, gains.
EXTRAS = {
    "value_embeds": ["model.value_embeds=1"],
    "unet_skips": ["model.unet_skips=true"],
    "adamw_lr_1e-2": ["train.lr=1e-2", "train.min_lr=1e-3"],
}
UNDO = {"rope": ["model.pos_encoding=learned"], "rmsnorm": ["model.norm=layernorm"],
        "qk_norm": ["model.qk_norm=false"], "relu2": ["model.activation=gelu"],
        "softcap": ["model.logit_softcap=0"], "zero_init": ["model.zero_init_proj=false"],
        "muon": ["train.optimizer=adamw"],
        "wsd": ["train.schedule=cosine", "train.lr=1e-3", "train.min_lr=1e-4"],
        "no_warmup": ["train.warmup_steps=100"]}


def shape_settings(scale: Scale, dtype: str, threads: int) -> list[str]:
    """The scale's shape and the run's settings. The thread count is fixed, not `auto`: auto
    counts the idle cores by the load average, which the reference's run just before has raised
    (a first measurement gave sheepop 1 thread against nanoGPT's 2 that way)."""
    s = scale.shape
    return [*(f"model.{k}={v}" for k, v in s.items() if k != "batch_size"),
            f"train.batch_size={s['batch_size']}", f"data.tokenizer={scale.data.tokenizer}",
            f"train.dtype={dtype}", f"train.threads={threads}", *COMMON]


def train_sheepop(dataset: Dataset, settings: list[str], steps: int, seed: int,
                  eval_every: int, target: float) -> dict:
    """One sheepop run in a scratch folder: its last val loss, and when it reached `target`."""
    cfg = build_config(None, None, [*settings, f"train.steps={steps}", f"train.seed={seed}",
                                    f"train.eval_interval={eval_every}",
                                    f"train.target_val_loss={target}"])
    with tempfile.TemporaryDirectory() as tmp:
        trainer = setup(None, cfg, Path(tmp) / "run", dataset=dataset, progress=False,
                        log=lambda *_: None)
        cpu = time.process_time()
        summary = trainer.run()  # (it stops at the target: its CPU time is the time to L)
        cpu = time.process_time() - cpu
    reached = summary.reached
    return {"val": summary.val_loss, "reached_step": reached[0] if reached else None,
            "reached_s": reached[1] if reached else None, "cpu": cpu}


def reference_data(dataset: Dataset, scale: Scale, seed: int):
    """(next_batch, evaluate) for nanoGPT's loop: sheepop's window sampler with the run's seed,
    and the mean loss over the held-out windows a sheepop run evaluates on (20 batches)."""
    block, batch = scale.shape["block_size"], scale.shape["batch_size"]
    pad = dataset.tokenizer.pad_id if dataset.tokenizer.pad_id is not None else 0
    sampler = WindowSampler(dataset.train, block, batch, seed, pad_id=pad)
    val_x, val_y = eval_windows(dataset.val, block, 20 * batch, pad)

    def next_batch():
        x, y = sampler.next_batch()
        return x.astype(np.int64), y.astype(np.int64)

    def evaluate(model) -> float:
        total, count = 0.0, 0
        for i in range(0, len(val_x), batch):
            x, y = (torch.as_tensor(a[i:i + batch].astype(np.int64)) for a in (val_x, val_y))
            logits, _ = model(x, y.clamp(min=0))
            total += float(F.cross_entropy(logits.float().flatten(0, 1), y.flatten(),
                                           ignore_index=IGNORE_INDEX, reduction="sum"))
            count += int((y != IGNORE_INDEX).sum())
        return total / count

    return next_batch, evaluate


def train_nanogpt(dataset: Dataset, scale: Scale, steps: int, seed: int,
                  autocast: torch.dtype | None, eval_every: int) -> dict:
    """nanoGPT's recipe in its own code, on sheepop's batches and evaluation windows."""
    s = scale.shape
    next_batch, evaluate = reference_data(dataset, scale, seed)
    torch.manual_seed(seed)
    model = nanogpt.ReferenceGPT(nanogpt.Shape(s["n_layer"], s["n_head"], s["n_embd"],
                                               s["block_size"], dataset.tokenizer.vocab_size))
    cpu = time.process_time()
    history = nanogpt.train_reference(model, next_batch, steps, evaluate, eval_every,
                                      autocast=autocast)
    return {"val": history[-1][2], "seconds": history[-1][1], "cpu": time.process_time() - cpu}


def step_parts(scale: Scale, base: list[str], recipe: list[str], vocab: int, rounds: int,
               autocast: torch.dtype | None) -> None:
    """Print each contender's step over nanoGPT's, side by side (round by round, median)."""
    s = scale.shape
    rng = np.random.default_rng(0)
    x = rng.integers(0, vocab, (s["batch_size"], s["block_size"]))
    y = np.roll(x, -1, axis=1)
    steps = {}
    torch.manual_seed(0)
    reference = nanogpt.ReferenceStep(
        nanogpt.ReferenceGPT(nanogpt.Shape(s["n_layer"], s["n_head"], s["n_embd"],
                                           s["block_size"], vocab)), autocast=autocast)
    xt, yt = torch.as_tensor(x), torch.as_tensor(y)
    steps["nanoGPT"] = lambda: reference(xt, yt)
    # (zero_init and wsd change no step's arithmetic: not timed)
    variants = {"sheepop": recipe, **{f"without {name}": recipe + UNDO[name] for name in RECIPE
                                      if name not in ("zero_init", "wsd")},
                "sheepop with nanoGPT's settings": []}
    for name, sets in variants.items():
        cfg = build_config(None, None, [*base, *sets, f"model.vocab_size={vocab}"])
        engine = TorchEngine(cfg.model, cfg.train)
        steps[name] = (lambda e: lambda: e.train_step([(x, y)], e.cfg.lr))(engine)
    names = list(steps)
    # Wall time, and the process's CPU time: on a core shared with other work the wall clock
    # also counts the others' turns, the CPU time only this step's (with one thread, the step)
    wall: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    for name in names:  # a warm-up step each (oneDNN builds its kernels on the first)
        steps[name]()
    for i in range(rounds):
        for name in names if i % 2 == 0 else names[::-1]:
            t0, c0 = time.perf_counter(), time.process_time()
            steps[name]()
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
        print(f"round {i + 1}/{rounds}  (load {os.getloadavg()[0]:.1f})", flush=True)

    def ratios(times: dict[str, list[float]], name: str) -> list[float]:
        return [a / b for a, b in zip(times[name], times["nanoGPT"])]

    ours = {kind: statistics.median(ratios(t, "sheepop")) for kind, t in (("wall", wall),
                                                                          ("cpu", cpu))}
    print("| step | wall ms | x nanoGPT's (range) | CPU ms | x nanoGPT's (range) | "
          "CPU x sheepop's |")
    print("|---|---|---|---|---|---|")
    for name in names:
        w, c = ratios(wall, name), ratios(cpu, name)
        print(f"| {name} | {statistics.median(wall[name]) * 1e3:,.0f} | "
              f"{statistics.median(w):.2f} ({min(w):.2f}-{max(w):.2f}) | "
              f"{statistics.median(cpu[name]) * 1e3:,.0f} | "
              f"{statistics.median(c):.2f} ({min(c):.2f}-{max(c):.2f}) | "
              f"{statistics.median(c) / ours['cpu']:.2f} |")
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    med = statistics.median(values)
    return f"{med:.1f} ({min(values):.1f}-{max(values):.1f})" if len(values) > 1 else f"{med:.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", choices=SCALES, default="char")
    ap.add_argument("--steps", type=int, default=0, help="the reference's steps (0: the scale's)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--first-seed", type=int, default=0,
                    help="the seeds are FIRST_SEED.. (two runs side by side, one core each)")
    ap.add_argument("--eval-every", type=int, default=0, help="0: the scale's")
    ap.add_argument("--reference-after", action="store_true",
                    help="train the reference again after the recipes, and time it as the mean "
                         "of its two runs (the machine's speed may move between them)")
    ap.add_argument("--budget", type=int, nargs="+", default=[], metavar="S",
                    help="train the recipes exactly S steps each, evaluated once at the end "
                         "(modded-nanogpt's rule; see above)")
    ap.add_argument("--max-factor", type=float, default=1.5,
                    help="sheepop's recipe may take up to this many times the reference's steps")
    ap.add_argument("--ablation", action="store_true")
    ap.add_argument("--extras", action="store_true",
                    help="also the recipe with each measured-and-left-out piece added")
    ap.add_argument("--also", nargs="+", action="append", default=[], metavar="SETTING",
                    help="also the recipe with these settings, e.g. --also "
                         "train.muon_ns_steps=3 (one variant each time it is given)")
    ap.add_argument("--max-bytes", type=int, default=0, help="0: the scale's")
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--step-parts", type=int, default=0, metavar="ROUNDS",
                    help="time the steps only, this many rounds (see above), and stop")
    args = ap.parse_args()
    scale = SCALES[args.scale]
    scale.steps = args.steps or scale.steps
    scale.eval_every = args.eval_every or scale.eval_every
    if args.max_bytes:
        scale.data.max_bytes = args.max_bytes
    torch.set_num_threads(args.threads)
    # sheepop's training start tells glibc to keep freed memory (sheepop.train.allocator): done
    # here, before either recipe runs, so that nanoGPT's steps run with the same allocator
    keep_freed_memory()
    bf16 = native_bf16(torch.device("cpu"))
    print(machine.summary())
    print(f"bf16 instructions: {'yes: both train under bf16 autocast' if bf16 else 'no: float32'}")
    if args.step_parts:
        base = shape_settings(scale, "bfloat16" if bf16 else "float32", args.threads) + NANOGPT
        step_parts(scale, base, [s for sets in RECIPE.values() for s in sets],
                   scale.data.vocab_size or 100, args.step_parts,
                   torch.bfloat16 if bf16 else None)
        return
    dataset = load_dataset(None, scale.data)
    print(f"{args.scale} scale: {len(dataset.train):,} train and {len(dataset.val):,} val tokens, "
          f"{dataset.tokenizer.vocab_size} ids", flush=True)
    base = shape_settings(scale, "bfloat16" if bf16 else "float32", args.threads) + NANOGPT
    recipe = [s for sets in RECIPE.values() for s in sets]
    variants = {"sheepop": recipe}
    if args.ablation:
        variants.update({f"without {name}": recipe + UNDO[name] for name in RECIPE})
    if args.extras:
        variants.update({f"with {name}": recipe + sets for name, sets in EXTRAS.items()})
    variants.update({f"with {' '.join(sets)}": recipe + sets for sets in args.also})
    cap = int(scale.steps * args.max_factor)
    # name -> (settings, steps, evaluation interval): to the target, or each budget
    runs = ({f"{name}, {budget} steps": (sets, budget, budget) for name, sets in variants.items()
             for budget in args.budget} if args.budget else
            {name: (sets, cap, scale.eval_every) for name, sets in variants.items()})
    ref_eval = scale.steps if args.budget else scale.eval_every
    rows: dict[str, list[dict]] = {"reference": [], **{k: [] for k in runs}}
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        ref = train_nanogpt(dataset, scale, scale.steps, seed, torch.bfloat16 if bf16 else None,
                            ref_eval)
        rows["reference"].append(ref)
        print(f"seed {seed}: nanoGPT {scale.steps} steps in {ref['seconds']:.1f} s "
              f"({ref['cpu']:.1f} s CPU), val loss L = {ref['val']:.4f}  "
              f"(load {os.getloadavg()[0]:.1f})", flush=True)
        for name, (sets, steps, every) in runs.items():
            run = train_sheepop(dataset, base + sets, steps, seed, every, ref["val"])
            rows[name].append(run)
            got = (f"reached L at step {run['reached_step']} in {run['reached_s']:.1f} s "
                   f"({run['cpu']:.1f} s CPU), val {run['val']:.4f}" if run["reached_step"]
                   else f"not in {steps} steps (val {run['val']:.4f})")
            print(f"  {name}: {got}  (load {os.getloadavg()[0]:.1f})", flush=True)
        if args.reference_after:  # the same run again: the recipes between its two timings
            again = train_nanogpt(dataset, scale, scale.steps, seed,
                                  torch.bfloat16 if bf16 else None, ref_eval)
            print(f"  nanoGPT again: {again['seconds']:.1f} s ({again['cpu']:.1f} s CPU), val "
                  f"loss {again['val']:.4f}; the reference's time: the mean of the two",
                  flush=True)
            for key in ("seconds", "cpu"):
                ref[key] = (ref[key] + again[key]) / 2
    ref_s = [r["seconds"] for r in rows["reference"]]
    print(f"\nnanoGPT: {scale.steps} steps, {spread(ref_s)} s (median, range), "
          f"L = {statistics.median(r['val'] for r in rows['reference']):.4f} "
          f"({min(r['val'] for r in rows['reference']):.4f}-"
          f"{max(r['val'] for r in rows['reference']):.4f})")
    # The time ratio is taken seed by seed (each run against the reference it alternated with,
    # under the same load), then the median: a burst of load on one reference moves one ratio,
    # where a ratio of medians would pair runs that never ran side by side.
    # On a core shared with other work the wall clock also counts the others' turns, which come
    # and go between the two runs; the process's CPU time counts this run's work alone.
    print("| recipe | steps to L | x reference | seconds to L | x reference, seed by seed "
          "(median) | CPU x reference, seed by seed (median) | reached |")
    print("|---|---|---|---|---|---|---|")
    for name in runs:
        done = [(r, ref) for r, ref in zip(rows[name], rows["reference"]) if r["reached_step"]]
        steps = [r["reached_step"] for r, _ in done]
        secs = [r["reached_s"] for r, _ in done]
        ratios = [r["reached_s"] / ref["seconds"] for r, ref in done]
        cpu = [r["cpu"] / ref["cpu"] for r, ref in done]
        ratio_steps = statistics.median(steps) / scale.steps if steps else float("nan")
        each = ", ".join(f"{x:.2f}" for x in ratios)
        ratio_s = f"{statistics.median(ratios):.2f} ({each})" if ratios else "-"
        each_cpu = ", ".join(f"{x:.2f}" for x in cpu)
        ratio_cpu = f"{statistics.median(cpu):.2f} ({each_cpu})" if cpu else "-"
        print(f"| {name} | {spread(steps)} | {ratio_steps:.2f} | {spread(secs)} | "
              f"{ratio_s} | {ratio_cpu} | {len(done)}/{len(rows[name])} |")
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
