"""`sheepop finetune BASE_RUN --data chats.jsonl --out RUN_DIR`: fine-tuning on conversations,
in full or with LoRA adapters (sheepop.finetune); `--demo` runs the built-in demonstration.

Its settings are config keys like `train`'s: [finetune] and [lora] (sheepop.config.schema), set
by a TOML file (--config), --set or the flags below, which are typed overrides of those keys."""

from __future__ import annotations

import argparse

from sheepop.cli.common import (
    HelpFormatter,
    add_config_flag,
    add_config_switch,
    add_set_option,
    add_threads_option,
)
from sheepop.errors import UserError


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
                    "the chosen layers. --method dpo learns a preference instead, from pairs "
                    '{"prompt" (or "messages"), "chosen", "rejected"}: the DPO loss against '
                    "the model before training (docs/derivations/dpo.md). --demo generates "
                    "the built-in instruction set, pretrains a small base model and compares "
                    "the base, LoRA and full fine-tuning on held-out items (docs/finetune.md).",
        formatter_class=HelpFormatter)
    p.add_argument("base_run", nargs="?", metavar="BASE_RUN", help="a run directory to start "
                   "from (not needed with --resume or --demo)")
    p.add_argument("--data", metavar="FILE", help="conversations, JSON Lines")
    p.add_argument("--out", metavar="RUN_DIR",
                   help="the fine-tuned run's directory (default: BASE_RUN-chat, beside the "
                        "base run; a directory that holds a run is refused unless --resume)")
    add_config_flag(p, "--lora-rank", "lora.rank")
    add_config_flag(p, "--lora-alpha", "lora.alpha")
    add_config_flag(p, "--lora-targets", "lora.targets", metavar="NAMES")
    add_config_switch(p, "--lora-freeze-new-tokens", "lora.train_new_tokens",
                      "with --lora-rank: keep the embedding (and head) rows of the chat tokens "
                      "added to the vocabulary frozen at their initial values", value=False)
    add_config_flag(p, "--train-on", "finetune.train_on")
    add_config_flag(p, "--method", "finetune.method")
    add_config_flag(p, "--beta", "finetune.beta")
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
    p.add_argument("--config", metavar="FILE", help="a TOML file with [train], [sample], "
                   "[finetune] and [lora] tables (its other tables are skipped; the model is "
                   "the base run's)")
    add_set_option(p, example="lora.rank=8",
                   keys="train.*, sample.*, finetune.* and lora.* keys (the model is the base "
                        "run's; resumed: train.* and sample.*)")
    p.add_argument("--help-config", action="store_true",
                   help="print every key with the value a fine-tune of BASE_RUN would run with "
                        "(this command's defaults, the file, --set and the flags) and exit")
    p.set_defaults(func=run)


def default_out(base_run: str) -> str:
    """Where a fine-tune goes without --out: beside its base, named after it (runs/mine ->
    runs/mine-chat), as `sheepop train`'s closing advice writes it."""
    return f"{base_run.rstrip('/')}-chat"


def run(args: argparse.Namespace) -> int:
    from sheepop.cli.common import flag_values
    if args.help_config:  # the values a fine-tune of BASE_RUN would run with
        from sheepop.cli.show_config import describe_values
        from sheepop.finetune.run import NEW_SECTIONS, settings_for
        cfg = settings_for(args.base_run, args.config, args.overrides, flag_values(args))
        print(describe_values(cfg, "finetune", sections=("model", *NEW_SECTIONS)))
        return 0
    if args.demo:
        from sheepop.finetune.demo import run_demo
        return run_demo(args.out or "runs/finetune-demo", args.minutes, args.engine or "torch",
                        progress=not args.no_progress)
    if not args.resume and (args.base_run is None or args.data is None):
        raise UserError("sheepop finetune needs BASE_RUN and --data (or --resume)")
    if args.out is None:
        if args.resume:
            raise UserError("sheepop finetune --resume needs --out RUN_DIR (the run to continue)")
        args.out = default_out(args.base_run)
        print(f"fine-tuning into {args.out} (--out: another directory)")
    from sheepop.finetune.run import finetune
    summary = finetune(args.base_run, args.data, args.out, overrides=args.overrides,
                       values=flag_values(args), resume=args.resume,
                       progress=not args.no_progress, config_file=args.config)
    for line in summary.lines():
        print(line)
    print(f"talk to it with: sheepop chat {args.out}")
    from sheepop.train.signals import exit_status
    return exit_status(summary.signum) if summary.interrupted else 0
