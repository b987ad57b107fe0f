"""`sheepop progression generate|train|eval`: the arithmetic-progression task end to end."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from sheepop.cli.common import (
    HelpFormatter,
    add_config_flag,
    add_config_options,
    add_threads_option,
)
from sheepop.config.schema import ENGINES
from sheepop.errors import UserError

DEFAULT_MINUTES = 10.0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("progression", help="the arithmetic-progression task",
                       description="Generate arithmetic progressions, train a transformer to "
                                   "continue them, and measure how exactly it does.")
    tasks = p.add_subparsers(dest="progression_command", metavar="STEP", required=True)
    _register_generate(tasks)
    _register_train(tasks)
    _register_eval(tasks)


def _register_generate(tasks: argparse._SubParsersAction) -> None:
    from sheepop.progression.spec import Spec
    d = Spec()
    g = tasks.add_parser(
        "generate", help="write a data directory of progressions",
        description="Write dataset.txt (one progression a line, D-digit terms separated by "
                    "single spaces; the last lines held out), the out-of-distribution sets "
                    "(ood_difference.txt, ood_difference_large.txt, ood_first_term.txt, "
                    "ood_length.txt, ood_digits_{D+1}.txt, ...), vocab.txt and meta.json "
                    "into DIR.",
        formatter_class=HelpFormatter)
    g.add_argument("--out", required=True, metavar="DIR")
    g.add_argument("--count", type=int, default=d.count, help="in-distribution sequences")
    g.add_argument("--seed", type=int, default=d.seed)
    g.add_argument("--digits", type=int, default=d.digits,
                   help="digits per term (0: the smallest width that holds the largest term)")
    g.add_argument("--min-terms", type=int, default=d.min_terms)
    g.add_argument("--max-terms", type=int, default=d.max_terms)
    g.add_argument("--min-difference", type=int, default=d.min_difference)
    g.add_argument("--max-difference", type=int, default=d.max_difference)
    g.add_argument("--first-min", type=int, default=d.first_min, help="smallest first term")
    g.add_argument("--first-max", type=int, default=d.first_max, help="largest first term")
    g.add_argument("--heldout", type=float, default=d.heldout,
                   help="fraction of the sequences held out for evaluation")
    g.add_argument("--ood-count", type=int, default=d.ood_count,
                   help="sequences in each out-of-distribution file")
    g.add_argument("--ood-more-digits", type=int, default=d.ood_more_digits,
                   help="also write sets of numbers with DIGITS+1 .. DIGITS+OOD_MORE_DIGITS "
                        "digits (ood_digits_*)")
    g.set_defaults(func=run_generate)


def _register_train(tasks: argparse._SubParsersAction) -> None:
    t = tasks.add_parser(
        "train", help="train a model on a data directory",
        description="Train the `progression` preset (single-head attention, ReLU FFN, "
                    "rotary positions over term indices and digit places; the earlier "
                    "sinusoidal one is --preset progression-sinusoidal) on term-aligned windows "
                    "of the training sequences, read both ways. "
                    f"Without --steps it trains for --minutes (default {DEFAULT_MINUTES:g}), "
                    "the learning-rate schedule fitted to that time.",
        formatter_class=HelpFormatter)
    t.add_argument("data", metavar="DIR", help="a directory made by `progression generate`")
    t.add_argument("--out", required=True, metavar="RUN_DIR")
    t.add_argument("--minutes", type=float, help="training time budget (without --steps: "
                   f"{DEFAULT_MINUTES:g})")
    add_config_flag(t, "--steps", "train.steps", help="optimizer steps (instead of a time "
                    "budget)")
    add_threads_option(t, "train.threads")
    add_config_flag(t, "--engine", "train.engine")
    add_config_flag(t, "--seed", "train.seed")
    t.add_argument("--window-terms", type=int, default=4,
                   help="terms per training window (the model sees the last WINDOW_TERMS - 1 "
                        "terms)")
    t.add_argument("--digit-order", choices=("reversed", "written"), default="reversed",
                   help="order of each term's digits inside the model: reversed = least "
                        "significant first, so every carry is already written when it is "
                        "needed (the files and the scores keep the written order)")
    t.add_argument("--loss-on", choices=("predicted", "all"), default="predicted",
                   help="predicted: no loss on each window's first two (unpredictable) terms")
    t.add_argument("--directions", choices=("up", "both"), default="both",
                   help="both: train on every sequence read forwards and backwards (a "
                        "decreasing progression of the same terms, difference -d); up: "
                        "forwards only")
    t.add_argument("--resume", action="store_true", help="continue the run in RUN_DIR")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_config_options(t, default_preset="progression")
    t.set_defaults(func=run_train)


def _register_eval(tasks: argparse._SubParsersAction) -> None:
    e = tasks.add_parser(
        "eval", help="exact-match accuracy on held-out and out-of-distribution sequences",
        description="Greedy next-term exact match, per-digit accuracy and whole-continuation "
                    "accuracy, by k (terms given) and by difference, on the held-out sequences "
                    "and on each out-of-distribution file. Writes progression.png and "
                    "progression_eval.json into RUN_DIR.",
        formatter_class=HelpFormatter)
    e.add_argument("run_dir", metavar="RUN_DIR")
    e.add_argument("--data", required=True, metavar="DIR")
    e.add_argument("--json", action="store_true",
                   help="end with one line holding the whole report as JSON")
    e.add_argument("--engine", choices=("run", *ENGINES), default="run",
                   help="the engine that runs the model; run: the one it was trained with")
    e.add_argument("--device", default="auto", help="torch engine: cpu, cuda, cuda:N, auto")
    e.add_argument("--max-sequences", type=int, default=0,
                   help="evaluate only the first N sequences of each set (0: all)")
    e.add_argument("--batch-size", type=int, default=2048, help="prefixes per forward pass")
    add_threads_option(e)
    e.set_defaults(func=run_eval)


def run_generate(args: argparse.Namespace) -> int:
    from sheepop.progression.data import write_dataset
    from sheepop.progression.spec import Spec
    spec = Spec(count=args.count, seed=args.seed, digits=args.digits, min_terms=args.min_terms,
                max_terms=args.max_terms, min_difference=args.min_difference,
                max_difference=args.max_difference, first_min=args.first_min,
                first_max=args.first_max, heldout=args.heldout, ood_count=args.ood_count,
                ood_more_digits=args.ood_more_digits)
    meta = write_dataset(args.out, spec)
    print(f"wrote {meta['count']:,} sequences ({meta['train']:,} train, {meta['heldout']:,} "
          f"held out) of {meta['digits']}-digit terms (largest {meta['largest_term']:,}) and "
          f"{args.ood_count:,} in each of {len(meta['sets'])} out-of-distribution sets "
          f"({', '.join(meta['sets'])}) to {args.out}")
    return 0


def run_train(args: argparse.Namespace) -> int:
    from sheepop.cli.common import flag_values, run_config, show_config
    from sheepop.config.build import build_config
    from sheepop.progression.data import load_progressions
    from sheepop.progression.task import TaskOptions, train
    if args.help_config or args.print_config:
        return show_config(args, run_config(args.out, args.overrides, args.config,
                                            flag_values(args)) if args.resume else
                           build_config(args.preset, args.config, args.overrides,
                                        values=flag_values(args)))
    for name, value in (("--minutes", args.minutes), ("--steps", args.steps)):
        if value is not None and value <= 0:
            raise UserError(f"{name} must be positive")
    if args.window_terms < 3:
        raise UserError("--window-terms must be at least 3 (two terms given, one predicted)")
    data = load_progressions(args.data)
    minutes = args.minutes
    if args.steps is None and minutes is None and not args.resume:
        minutes = DEFAULT_MINUTES
    if args.resume:
        base = run_config(args.out)
        cfg = run_config(args.out, args.overrides, args.config, flag_values(args))
    else:
        base = build_config(args.preset)
        cfg = build_config(args.preset, args.config, args.overrides, values=flag_values(args))
    if args.steps is not None and minutes:
        cfg.train.max_minutes, minutes = minutes, None  # a fixed step count, capped in time
    opts = TaskOptions(data.digits, args.window_terms, args.digit_order == "reversed",
                       2 if args.loss_on == "predicted" else 0, str(Path(args.data)),
                       args.directions == "both")
    summary = train(data, cfg, opts, args.out, minutes, args.resume,
                    progress=not args.no_progress, base=base)
    for line in summary.lines():
        print(line)
    print(f"evaluate it with: sheepop progression eval {args.out} --data {args.data}")
    from sheepop.train.signals import exit_status
    return exit_status(summary.signum) if summary.interrupted else 0


def run_eval(args: argparse.Namespace) -> int:
    from sheepop.files import atomic_write_text
    from sheepop.inference.load import build, read_run
    from sheepop.progression.data import load_progressions
    from sheepop.progression.report import evaluate_sets, plot, table
    from sheepop.progression.task import TaskOptions
    if args.max_sequences < 0 or args.batch_size < 1:
        raise UserError("--max-sequences must be >= 0 and --batch-size >= 1")
    opts = TaskOptions.load(args.run_dir)
    cfg, tokenizer, weights = read_run(args.run_dir)
    data = load_progressions(args.data)
    engine = cfg.train.engine if args.engine == "run" else args.engine
    model = build(cfg, weights, tokenizer, engine, args.device)
    report = evaluate_sets(model, data, opts, args.max_sequences, args.batch_size)
    report["run_dir"], report["data"] = str(args.run_dir), str(args.data)
    print(table(report))
    plot(report, Path(args.run_dir) / "progression.png", title=str(args.run_dir))
    atomic_write_text(Path(args.run_dir) / "progression_eval.json",
                      json.dumps(report, indent=1) + "\n")
    print(f"plot: {Path(args.run_dir) / 'progression.png'}")
    if args.json:
        print(json.dumps(report))
    return 0
