"""`sheepop finetune --demo`: fine-tuning shown to work, offline, in one command.

    1. data     the built-in instruction set (sheepop.finetune.tasks): train.jsonl, heldout.jsonl
    2. base     a `tiny` char model pretrained on the built-in corpus (reused when OUT/base holds
                one), `--base-minutes` of training
    3. lora     rank-8 adapters on the attention's qkv and the FFN's first layer (and the chat
                tokens' rows), the base frozen
    4. full     every weight trained
    5. score    greedy answers to the held-out items, exact match, by kind, for base, lora, full

Each fine-tune gets the same time budget: a short calibration run times its steps, and
`train.steps` is set so that its cosine schedule ends when the budget does (`train.max_minutes`
still stops it if the machine slows down). The table goes to standard output and OUT/demo.json.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from sheepop.arch.lora import LoraConfig
from sheepop.checkpoint import format as checkpoint
from sheepop.config.build import build_config
from sheepop.config.schema import DataConfig, SampleConfig
from sheepop.files import atomic_write_text
from sheepop.finetune.run import base_model, finetune
from sheepop.finetune.tasks import read_items, score, write_demo_data
from sheepop.generation.generate import generate_batch_ids
from sheepop.inference.load import build, load
from sheepop.tokenizers.chat_format import chat_ids, turn_end

N_TRAIN, N_HELDOUT = 20_000, 300
BASE_MINUTES, MINUTES = 5.0, 10.0
# LoRA: rank 8 on qkv and fc, 4.4% of tiny's parameters with the new rows. The learning rates
# measured best for each at this budget (docs/finetune.md); alpha 32 (a scale of 4) beat 16 at
# the same rate. A full fine-tune moves every weight: a smaller rate.
SETTINGS = {"lora": ("lora.rank=8", "lora.alpha=32", "lora.targets=qkv,fc", "train.lr=3e-3"),
            "full": ("train.lr=1e-3",)}
CALIBRATION_STEPS = 15
# One torch thread: on a busy 2-core machine two threads wait for each other and a step became
# 10-17x slower (measured: full fine-tuning at 1,000 tokens/s against 15,000 with one thread);
# on a quiet one two threads gain only ~25% here.
THREADS = ("train.threads=1",)


def answers(model, items, max_new_tokens: int = 12, batch: int = 64,
            system: str | None = None) -> list[str]:
    """Greedy answers of `model` (an InferenceModel with a chat template) to each item's
    prompt (after the `system` message when one is given)."""
    tok = model.tokenizer
    turn = turn_end(tok)
    # The answer ends at the turn's end or at any other special token (sheepop chat's rule):
    # cut on the ids, since a model's own end (SmolLM2's <|im_end|>) is not sheepop's <|end|>.
    ends = turn.ids | {tok.special_tokens[name] for name in turn.stops}
    greedy = SampleConfig(max_new_tokens=max_new_tokens, temperature=0.0)
    out = []
    for i in range(0, len(items), batch):
        prompts = [chat_ids(tok, it.messages(system)[:-1], True)[0]
                   for it in items[i:i + batch]]
        for ids in generate_batch_ids(model.lm, prompts, greedy, eos_id=turn.eos_id):
            cut = next((k for k, t in enumerate(ids) if t in ends), len(ids))
            out.append(tok.decode(ids[:cut]))
    return out


def _pretrain(run_dir: Path, minutes: float, engine: str, progress: bool) -> None:
    from sheepop.train.start import setup
    cfg = build_config("tiny", values={"train.max_minutes": minutes, "train.steps": 100_000,
                                       "train.engine": engine, "train.eval_interval": 0,
                                       "train.threads": 1,
                                       "train.checkpoint_interval": 0})
    cfg.train.decay_steps = int(minutes * 60 * 4)  # ~4 steps/s on 2 cores: the usual decay
    setup(None, cfg, run_dir, progress=progress).run()


def _finetune_for(base: Path, data: Path, out: Path, minutes: float, engine: str,
                  progress: bool, settings: tuple[str, ...] = ()):
    """Fine-tune with a schedule fitted to `minutes` (after timing a few steps)."""
    probe = out.with_name(out.name + "-calibration")
    fixed = ["train.eval_interval=0", "train.checkpoint_interval=0", f"train.engine={engine}",
             *THREADS, *settings]
    t0 = time.perf_counter()
    per_step = float("inf")
    for _ in range(2):  # the faster of two probes: a moment of load must not shrink the run
        shutil.rmtree(probe, ignore_errors=True)
        summary = finetune(str(base), str(data), probe, overrides=fixed,
                           values={"train.steps": CALIBRATION_STEPS}, log=lambda *_: None,
                           progress=False)
        per_step = min(per_step, summary.seconds / max(summary.steps, 1))
    shutil.rmtree(probe, ignore_errors=True)
    budget = 60 * minutes - (time.perf_counter() - t0)
    steps = max(1, int(0.95 * budget / per_step))
    print(f"{out.name}: {per_step * 1000:.0f} ms/step, {steps:,} steps in {budget / 60:.1f} min")
    return finetune(str(base), str(data), out,
                    overrides=[*fixed, f"train.max_minutes={budget / 60:.4f}"],
                    values={"train.steps": steps}, progress=progress)


def run_demo(out: str | Path, minutes: float | None = None, engine: str = "torch",
             progress: bool = True, base_minutes: float = BASE_MINUTES) -> int:
    out = Path(out)
    minutes = MINUTES if minutes is None else minutes
    paths = write_demo_data(out / "data", N_TRAIN, N_HELDOUT, seed=0)
    # Two sets are set apart, each for its own figure: say which is which.
    print(f"data: {N_TRAIN:,} training conversations in {paths['train']} (each fine-tune "
          f"keeps {DataConfig().val_fraction:.0%} of them apart for its val loss) and "
          f"{N_HELDOUT:,} held-out items in {paths['heldout']}, answered and scored at the end")
    heldout = read_items(paths["heldout"])
    base = out / "base"
    if not checkpoint.holds_checkpoint(base):
        print(f"pretraining the base model for {base_minutes:g} minutes on the built-in data")
        _pretrain(base, base_minutes, engine, progress)
    rows: list[dict[str, Any]] = []
    cfg, tokenizer, weights, _ = base_model(base)
    base_scores = score(answers(build(cfg, weights, tokenizer, engine), heldout), heldout)
    rows.append({"model": "base", "trainable": 0, "minutes": 0.0, **base_scores})
    for name in ("lora", "full"):
        run = out / name
        if checkpoint.holds_checkpoint(run):
            shutil.rmtree(run)
        summary = _finetune_for(base, paths["train"], run, minutes, engine, progress,
                                SETTINGS[name])
        model = load(run, engine)
        trainable = _trainable(cfg, LoraConfig.load(run))  # the run's: new token rows too
        rows.append({"model": name, "trainable": trainable, "minutes": summary.seconds / 60,
                     **score(answers(model, heldout), heldout)})
    print(table(rows, _total(weights)))
    atomic_write_text(out / "demo.json", json.dumps(rows, indent=1) + "\n")
    return 0


def _total(weights) -> int:
    return sum(w.size for w in weights.values())


def _trainable(cfg, lora: LoraConfig | None) -> int:
    from sheepop.arch.lora import adapter_param_count
    from sheepop.config.model_size import param_count
    return param_count(cfg.model) if lora is None else adapter_param_count(cfg.model, lora)


def table(rows: list[dict[str, Any]], total: int) -> str:
    kinds = sorted({k for r in rows for k in r["by_kind"]})
    head = ("| model | trainable parameters | minutes | held-out exact | "
            + " | ".join(kinds) + " |")
    lines = [head, "|" + "---|" * (4 + len(kinds))]
    for r in rows:
        share = f"{r['trainable']:,} ({100 * r['trainable'] / total:.1f}%)"
        by = " | ".join(f"{100 * r['by_kind'][k]['exact']:.1f}%" for k in kinds)
        lines.append(f"| {r['model']} | {share} | {r['minutes']:.1f} | "
                     f"{100 * r['exact']:.1f}% | {by} |")
    return "\n".join(lines)
