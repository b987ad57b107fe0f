"""`sheepop finetune BASE_RUN --data chats.jsonl --out RUN_DIR`: fine-tuning on conversations,
in full or with LoRA adapters (sheepop.finetune); `--demo` runs the built-in demonstration."""

from __future__ import annotations

import argparse

from sheepop.cli.common import (
    HelpFormatter,
    add_config_flag,
    add_set_option,
    add_threads_option,
)
from sheepop.errors import UserError

TARGETS = "qkv,proj"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "finetune", help="fine-tune a run on conversations (full or LoRA)",
        description="Supervised fine-tuning of a trained run on conversations (JSON Lines: "
                    '{"messages": [{"role": "system"|"user"|"assistant", "content": ...}]} or '
                    '{"prompt": ..., "completion": ...}). '
                    "sheepop's chat tokens are added to the tokenizer unless it has its own "
                    "chat template (an imported chat model's), the loss counts the "
                    "assistant's tokens, and either every weight "
                    "trains or, with --lora-rank, only low-rank adapters W + (alpha/r) B A on "
                    "the chosen layers. --demo generates the built-in instruction set, "
                    "pretrains a small base model and compares the base, LoRA and full "
                    "fine-tuning on held-out items (docs/finetune.md).",
        formatter_class=HelpFormatter)
    p.add_argument("base_run", nargs="?", metavar="BASE_RUN", help="a run directory to start "
                   "from (not needed with --resume or --demo)")
    p.add_argument("--data", metavar="FILE", help="conversations, JSON Lines")
    p.add_argument("--out", metavar="RUN_DIR", help="the fine-tuned run's directory")
    p.add_argument("--lora-rank", type=int, metavar="R",
                   help="train rank-R adapters instead of every weight (default: full "
                        "fine-tuning)")
    p.add_argument("--lora-alpha", type=float, metavar="A",
                   help="the adapters' scale is A / R (default: 2R, a scale of 2)")
    p.add_argument("--lora-targets", default=TARGETS, metavar="NAMES",
                   help="comma-separated layers that get adapters: qkv, proj (attention), fc "
                        "(the FFN's first layer; swiglu: gate and up), down (the FFN's output)")
    p.add_argument("--lora-freeze-new-tokens", action="store_true",
                   help="with --lora-rank: keep the embedding (and head) rows of the chat tokens "
                        "added to the vocabulary frozen at their initial values (default: they "
                        "train with the adapters)")
    p.add_argument("--train-on", choices=("assistant", "all"), default="assistant",
                   help="which tokens the loss counts: the assistant's, or all of them")
    add_config_flag(p, "--steps", "train.steps", note="{key}; default 300")
    add_config_flag(p, "--engine", "train.engine")
    add_config_flag(p, "--seed", "train.seed")
    add_threads_option(p, "train.threads")
    p.add_argument("--resume", action="store_true", help="continue the run in RUN_DIR")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--demo", action="store_true",
                   help="run the built-in demonstration into --out (default runs/finetune-demo)")
    p.add_argument("--minutes", type=float, default=None,
                   help="--demo: minutes of fine-tuning for each of LoRA and full")
    add_set_option(p, example="train.lr=1e-3",
                   keys="train.* and sample.* keys (the model is the base run's)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sheepop.cli.common import flag_values
    if args.demo:
        from sheepop.finetune.demo import run_demo
        return run_demo(args.out or "runs/finetune-demo", args.minutes, args.engine or "torch",
                        progress=not args.no_progress)
    if args.out is None:
        raise UserError("sheepop finetune needs --out RUN_DIR")
    if not args.resume and (args.base_run is None or args.data is None):
        raise UserError("sheepop finetune needs BASE_RUN and --data (or --resume)")
    lora = None
    if args.lora_rank is not None:
        from sheepop.arch.lora import LoraConfig
        alpha = args.lora_alpha if args.lora_alpha is not None else 2.0 * args.lora_rank
        targets = [t.strip() for t in args.lora_targets.split(",") if t.strip()]
        lora = LoraConfig(args.lora_rank, alpha, targets)
    elif args.lora_alpha is not None or args.lora_freeze_new_tokens:
        flag = "--lora-alpha" if args.lora_alpha is not None else "--lora-freeze-new-tokens"
        raise UserError(f"{flag} needs --lora-rank")
    from sheepop.finetune.run import finetune
    summary = finetune(args.base_run, args.data, args.out, lora, args.train_on, args.overrides,
                       flag_values(args), args.resume, progress=not args.no_progress,
                       train_new_tokens=not args.lora_freeze_new_tokens)
    for line in summary.lines():
        print(line)
    print(f"talk to it with: sheepop chat {args.out}")
    from sheepop.train.signals import exit_status
    return exit_status(summary.signum) if summary.interrupted else 0
