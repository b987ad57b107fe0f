"""`sheepop train [DATA]`: train a GPT on a prepared data directory, a text file or folder, or the
built-in standard-library corpus."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from sheepop.cli.common import (
    DEFAULT_PRESET,
    WITH_DEFAULT,
    HelpFormatter,
    add_config_flag,
    add_config_options,
    add_config_switch,
    add_threads_option,
    flag_values,
    run_config,
    show_config,
)
from sheepop.config.build import build_config
from sheepop.config.schema import Config

DEMO_OUT = "runs/finetune-demo"  # where `sheepop finetune --demo` writes (its default --out)

# The training flags' help says the value that applies without them: the default preset's.
DEFAULTS = {"note": WITH_DEFAULT, "preset": DEFAULT_PRESET}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train", help="train a model",
        description="Train a GPT. DATA is a directory made by `sheepop prepare`, or a file or "
                    "folder read as `sheepop prepare` reads it (text, code, HTML, PDF, images, "
                    "JSON Lines, Parquet; capped at data.max_bytes); without DATA, the Python "
                    "standard library source of this interpreter is used. Flags that name a "
                    "config key set it after the preset, --config and --set. The start-up "
                    "lines report the data, the tokenizer and the model: its parameters and "
                    "its KV cache's memory per token of context when generating. While it "
                    "trains: a progress bar on a terminal; elsewhere (a log file, a pipe) a "
                    "plain line every train.log_interval steps (step, loss, lr, tokens/s, ETA) "
                    "and one per evaluation. Each evaluation that lowers the val loss replaces "
                    "RUN_DIR/best/ (generate, chat, eval and serve load it with --best).",
        formatter_class=HelpFormatter)
    p.add_argument("data", nargs="?", metavar="DATA", help="training data (default: the "
                   "standard library source)")
    p.add_argument("--out", default="runs/default", metavar="RUN_DIR",
                   help="run directory for checkpoints, metrics and plots")
    add_config_flag(p, "--steps", "train.steps", **DEFAULTS)
    add_config_flag(p, "--seed", "train.seed", **DEFAULTS)
    add_config_flag(p, "--engine", "train.engine", **DEFAULTS)
    add_config_flag(p, "--device", "train.device", **DEFAULTS)
    add_config_flag(p, "--dtype", "train.dtype", **DEFAULTS)
    add_threads_option(p, "train.threads")
    add_config_flag(p, "--tokenizer", "data.tokenizer",
                    help="the tokenizer kind trained on raw-text DATA (a prepared DATA directory "
                         "brings its own)", **DEFAULTS)
    add_config_flag(p, "--vocab-size", "data.vocab_size", **DEFAULTS)
    add_config_flag(p, "--text-field", "data.text_field", metavar="FIELD", **DEFAULTS)
    add_config_flag(p, "--val-data", "data.val_data", metavar="FILE",
                    note="{key}; without it, data.val_fraction of DATA",
                    preset=DEFAULTS["preset"])
    add_config_flag(p, "--target-val-loss", "train.target_val_loss", metavar="LOSS", **DEFAULTS)
    add_config_switch(p, "--follow-links", "data.follow_links",
                      "raw-text DATA: also read what symbolic links leading outside it point to")
    add_config_switch(p, "--tensorboard", "train.tensorboard",
                      "also write the metrics as TensorBoard events in RUN_DIR/tensorboard/ "
                      "(needs the tensorboard package)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in RUN_DIR from its last checkpoint")
    p.add_argument("--init-from", metavar="SOURCE_RUN",
                   help="start a new run from the model of SOURCE_RUN (a trained, imported or "
                        "fine-tuned run; a LoRA run merged): its architecture, tokenizer and "
                        "weights, with a new optimizer from step 0 and this run's [train] "
                        "settings; of the model, only model.dropout and model.block_size may be "
                        "set (the context lowered, or raised where positions are not learned)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar, even on a terminal: plain lines instead")
    p.add_argument("--sample", metavar="PROMPT",
                   help="after training, continue PROMPT with the trained model as `sheepop "
                        "generate RUN_DIR --prompt PROMPT` does, between the summary and the "
                        "commands to go on (`make run` does)")
    p.add_argument("--nproc", type=int, help="train on NPROC processes of this machine "
                   "(DDP through torchrun; see docs/distributed.md)")
    add_config_options(p)
    p.set_defaults(func=run, train_parser=p)


def config_from_args(args: argparse.Namespace) -> Config:
    """Preset (or the run's saved config with --resume), file, --set, then the typed flags;
    with --init-from, the model's settings are the source run's (sheepop.train.init_from)."""
    if args.init_from is not None:
        from sheepop.errors import UserError
        from sheepop.train.init_from import WITH_RESUME, init_config, open_source
        if args.resume:
            raise UserError(WITH_RESUME)
        source = open_source(args.init_from, args.out)
        return init_config(source, args.preset, args.config, args.overrides, flag_values(args))
    if args.resume:
        from sheepop.train.run_lock import check_free
        check_free(args.out)  # a running writer may be replacing the checkpoint right now
        return run_config(args.out, args.overrides, args.config, flag_values(args))
    return build_config(args.preset, args.config, args.overrides, values=flag_values(args))


def run(args: argparse.Namespace) -> int:
    if args.help_config or args.print_config:
        return show_config(args, config_from_args(args))
    from sheepop.train import signals
    with signals.deferred():  # it imports torch, whose start a Ctrl-C could abort (signals.py)
        from sheepop.train import distributed
    if args.nproc and not distributed.under_torchrun():
        from sheepop.cli.launch import argv_from_args, launch
        return launch(args.nproc, ["train", *argv_from_args(args.train_parser, args, ("nproc",))])
    from sheepop.train.start import refuse_run_as_data, schedule_warning, setup
    refuse_run_as_data(args.data)
    cfg = config_from_args(args)
    with distributed.session(cfg.train) as job:  # one process, or this rank of a torchrun job
        trainer = setup(args.data, cfg, args.out, resume=args.resume, log=job.log,
                        is_main=job.is_main, progress="lines" if args.no_progress else True,
                        wrap_engine=job.wrap_engine, init_from=args.init_from)
        job.shard(trainer)
        if job.is_main and (warning := schedule_warning(trainer.cfg.train)) is not None:
            print(f"sheepop: warning: {warning}", file=sys.stderr)  # once it is sure to train
        summary = trainer.run()
    # Interrupted (Ctrl-C, SIGTERM, SIGHUP): 128 + the signal's number, as a shell reports it.
    status = signals.exit_status(summary.signum) if summary.interrupted else 0
    if job.is_main:
        from sheepop.train.plots import write_run_plots  # rank 0 only: matplotlib loads slowly
        write_run_plots(args.out, cfg.train)
        for line in summary.lines():
            print(line)
        if args.sample is not None and not summary.interrupted:
            sample(args.out, args.sample)
        for line in next_commands(args.out, summary.best_step is not None, summary.interrupted):
            print(line)
    return job.leave(status)


def sample(run_dir: str | Path, prompt: str) -> None:
    """`sheepop generate RUN_DIR --prompt PROMPT`, the command itself (its settings, its lines
    on stderr), then a blank line: the sample comes after the summary and before the commands
    to go on, which are the last thing a newcomer reads."""
    from sheepop.cli import build_parser  # the whole command line: generate's own parser
    args = build_parser().parse_args(["generate", str(run_dir), "--prompt", prompt])
    args.func(args)
    print(flush=True)


def next_commands(run_dir: str | Path, has_best: bool, interrupted: bool = False) -> list[str]:
    """What to do with the run now: continue it (when interrupted), sample from it, measure it
    on a text, make it a chat model: conversations come from `sheepop finetune --demo` (which
    writes them, then fine-tunes its own base on them) or from the user; `sheepop chat` then.
    The one block of advice: `make run` prints no other."""
    run = shlex.quote(str(run_dir))
    chat = shlex.quote(f"{str(run_dir).rstrip('/')}-chat")
    best = "    # --best: the best checkpoint" if has_best else ""
    resume = [f"  sheepop train --resume --out {run}    # continue it"] if interrupted else []
    from sheepop.finetune.demo import BASE_MINUTES, MINUTES  # its base, then LoRA and full
    chats, minutes = f"{DEMO_OUT}/data/train.jsonl", f"{BASE_MINUTES + 2 * MINUTES:g}"
    return ["next:", *resume,
            f"  sheepop generate {run} --prompt 'def '{best}",
            f"  sheepop eval {run} --data FILE    # loss, perplexity, bits per byte on any text",
            f"  sheepop finetune --demo    # writes conversations to {chats}, fine-tunes a base "
            f"model on them (about {minutes} min), then: sheepop chat {DEMO_OUT}/full",
            f"  sheepop finetune {run} --data {chats} --out {chat}    # this run on them (or on "
            f"your own, JSON Lines), then: sheepop chat {chat}"]
    # (a rank of a torchrun job exits after these lines: distributed.Ranks.leave)
