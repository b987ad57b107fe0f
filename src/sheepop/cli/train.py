"""`sheepop train [DATA]`: train a GPT on a prepared data directory, a text file or folder, or the
built-in standard-library corpus."""

from __future__ import annotations

import argparse

from sheepop.cli.common import add_config_options, run_config
from sheepop.config import build_config, describe_fields


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train", help="train a model",
        description="Train a GPT. DATA is a directory made by `sheepop prepare`, a text file or "
                    "a folder of text files; without DATA, the Python standard library source of "
                    "this interpreter (capped at data.max_bytes) is used.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("data", nargs="?", metavar="DATA", help="training data (default: the "
                   "standard library source)")
    p.add_argument("--out", default="runs/default", metavar="RUN_DIR",
                   help="run directory for checkpoints, metrics and plots")
    p.add_argument("--steps", type=int, help="optimizer steps (train.steps)")
    p.add_argument("--seed", type=int, help="random seed (train.seed)")
    p.add_argument("--engine", choices=("torch", "numpy"), help="train.engine")
    p.add_argument("--device", help="train.device: cpu, cuda, cuda:N, auto")
    p.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16", "float64"),
                   help="train.dtype")
    p.add_argument("--tokenizer", choices=("char", "word", "bpe", "digits"),
                   help="data.tokenizer: the kind trained on raw-text DATA (a prepared DATA "
                        "directory brings its own)")
    p.add_argument("--vocab-size", type=int, help="data.vocab_size for word/bpe")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in RUN_DIR from its last checkpoint")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--nproc", type=int, metavar="N", help="train on N processes of this machine "
                   "(DDP through torchrun; see docs/distributed.md)")
    add_config_options(p)
    p.set_defaults(func=run, train_parser=p)


def config_from_args(args: argparse.Namespace):
    overrides = list(args.overrides)
    for key, value in (("train.steps", args.steps), ("train.seed", args.seed),
                       ("train.engine", args.engine), ("train.device", args.device),
                       ("train.dtype", args.dtype), ("data.tokenizer", args.tokenizer),
                       ("data.vocab_size", args.vocab_size)):
        if value is not None:
            overrides.append(f"{key}={value}")
    if args.resume:
        return run_config(args.out, overrides, args.config)
    return build_config(args.preset, args.config, overrides)


def run(args: argparse.Namespace) -> int:
    if args.help_config:
        print(describe_fields())
        return 0
    from sheepop.train import distributed
    if args.nproc and not distributed.under_torchrun():
        from sheepop.cli.launch import argv_from_args, launch
        return launch(args.nproc, ["train", *argv_from_args(args.train_parser, args, ("nproc",))])
    from sheepop.train.loop import setup
    cfg = config_from_args(args)
    with distributed.session(cfg.train) as job:  # one process, or this rank of a torchrun job
        trainer = setup(args.data, cfg, args.out, resume=args.resume, log=job.log,
                        is_main=job.is_main, progress=not args.no_progress,
                        wrap_engine=job.wrap_engine)
        job.shard(trainer)
        summary = trainer.run()
    if not job.is_main:
        return 130 if summary.interrupted else 0
    from sheepop.train.plots import write_run_plots  # rank 0 only: matplotlib is slow to load
    write_run_plots(args.out, cfg.train)
    for line in summary.lines():
        print(line)
    return 130 if summary.interrupted else 0
