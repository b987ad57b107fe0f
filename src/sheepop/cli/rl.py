"""`sheepop rl BASE_RUN --prompts FILE | --task NAME --out RUN_DIR`: reinforcement learning with
verifiable rewards (sheepop.rl), in full or with LoRA adapters, in either engine.

A command of its own beside `finetune` rather than `finetune --method grpo`: fine-tuning (and
DPO) learns from given text, conversations or pairs of them, while RL learns from the model's
own answers to prompts, scored by a verifier; its inputs (prompts, a verifier) and its settings
(group size, clipping, KL) share nothing with fine-tuning's data, and its log (reward, pass@1)
is not a loss curve. Its settings are config keys like the others: [rl], [lora], train.*."""

from __future__ import annotations

import argparse

from sheepop.cli.common import (
    HelpFormatter,
    add_config_flag,
    add_set_option,
    add_threads_option,
)
from sheepop.errors import UserError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "rl", help="reinforcement learning with verifiable rewards (GRPO-style, full or LoRA)",
        description="Reinforcement learning on a trained run: each step samples "
                    "--group-size answers to each of train.batch_size prompts, scores them "
                    "with a verifier, and takes the policy-gradient step on each answer's "
                    "advantage (its reward less its group's mean), the token-level mean of "
                    "the advantage-weighted log-probabilities, with the importance ratio "
                    "clipped when a batch serves several updates and an optional KL term to "
                    "the starting model (docs/finetune.md, docs/derivations/"
                    "policy-gradient.md). Prompts: JSON Lines, one "
                    '{"prompt": ... | "messages": [...], "answer": ...} a line, or a '
                    "built-in --task. A model that can chat answers through its chat "
                    "template; any other continues the prompt's text.",
        formatter_class=HelpFormatter)
    p.add_argument("base_run", nargs="?", metavar="BASE_RUN",
                   help="a run directory to start from (not needed with --resume)")
    p.add_argument("--prompts", metavar="FILE", help="prompts, JSON Lines (rl.task=file)")
    add_config_flag(p, "--task", "rl.task")
    add_config_flag(p, "--verifier", "rl.verifier", metavar="NAME")
    add_config_flag(p, "--group-size", "rl.group_size")
    add_config_flag(p, "--kl", "rl.kl")
    add_config_flag(p, "--updates", "rl.updates")
    p.add_argument("--out", metavar="RUN_DIR", help="the run's directory (default: BASE_RUN-rl, "
                   "beside the base run; a directory that holds a run is refused unless "
                   "--resume)")
    add_config_flag(p, "--lora-rank", "lora.rank")
    add_config_flag(p, "--steps", "train.steps", note="{key}; default 50")
    add_config_flag(p, "--engine", "train.engine")
    add_config_flag(p, "--seed", "train.seed")
    add_threads_option(p, "train.threads")
    p.add_argument("--resume", action="store_true", help="continue the run in RUN_DIR")
    p.add_argument("--config", metavar="FILE", help="a TOML file with [train], [sample], [lora] "
                   "and [rl] tables (its other tables are skipped; the model is the base run's)")
    add_set_option(p, example="rl.group_size=16",
                   keys="train.*, sample.*, lora.* and rl.* keys (the model is the base run's; "
                        "resumed: train.* and sample.*)")
    p.add_argument("--help-config", action="store_true",
                   help="print every key with the value an RL run of BASE_RUN would run with "
                        "(this command's defaults, the file, --set and the flags) and exit")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sheepop.cli.common import flag_values
    if args.help_config:
        from sheepop.checkpoint import format as checkpoint
        from sheepop.cli.show_config import describe_values
        from sheepop.config.schema import Config
        from sheepop.rl.run import NEW_SECTIONS, settings
        base = Config() if args.base_run is None else Config.from_saved(
            checkpoint.load_config(args.base_run), args.base_run)
        cfg = settings(base, args.config, args.overrides, flag_values(args))
        print(describe_values(cfg, "rl", sections=("model", *NEW_SECTIONS)))
        return 0
    if args.out is None:
        if args.resume or args.base_run is None:
            raise UserError("sheepop rl --resume needs --out RUN_DIR (the run to continue)"
                            if args.resume else "sheepop rl needs BASE_RUN (or --resume)")
        args.out = f"{args.base_run.rstrip('/')}-rl"
        print(f"training into {args.out} (--out: another directory)")
    from sheepop.rl.start import reinforce
    summary = reinforce(args.base_run, args.prompts, args.out, overrides=args.overrides,
                        values=flag_values(args), resume=args.resume, config_file=args.config)
    for line in summary.lines():
        print(line)
    print(f"talk to it with: sheepop chat {args.out}" if summary.chats
          else f"try it with: sheepop generate {args.out} --prompt TEXT")
    from sheepop.train.signals import exit_status
    return exit_status(summary.signum) if summary.interrupted else 0
