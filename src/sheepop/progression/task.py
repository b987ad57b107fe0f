"""Training a model on progressions through the shared trainer, and the run's task options.

The model and optimizer settings come from the `progression` preset (then a TOML file, then
`--set`), exactly as for `sheepop train`; what belongs to the task lives in the run's
`progression.json`:

    {"format": "sheepop-progression-run", "version": 1, "digits": D, "window_terms": m,
     "reverse_digits": false, "mask_given": 2, "data": "DIR", "both_ways": false}

(`both_ways`: every training sequence is also read backwards, `--directions both`; a run file
without it is read as false).

`model.block_size` is always m (D + 1) - 1: one term-aligned window (see `stream.py`).

With a time budget and no step count, a throwaway engine times a few steps first and
`train.steps` is set so that the cosine schedule ends when the budget does; `train.max_minutes`
(the budget less the calibration) still stops the run if the machine gets slower.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sheepop.checkpoint import format as checkpoint
from sheepop.config.schema import Config, resolve_vocab_size
from sheepop.data.dataset import Dataset
from sheepop.errors import UserError
from sheepop.files import DocumentFormat, read_fields, write_document
from sheepop.progression.data import Progressions
from sheepop.progression.stream import TermWindows, TermWindowSampler, flat_stream
from sheepop.tokenizers.digits import DigitsTokenizer

RUN_FILE = "progression.json"
RUN_FORMAT = "sheepop-progression-run"
RUN_DOCUMENT = DocumentFormat(RUN_FORMAT, 1, "sheepop progression run file")


@dataclass
class TaskOptions:
    digits: int
    window_terms: int = 4
    reverse_digits: bool = False
    mask_given: int = 2
    data: str = ""
    both_ways: bool = False

    @property
    def block_size(self) -> int:
        return self.window_terms * (self.digits + 1) - 1

    def save(self, run_dir: str | Path) -> None:
        write_document(Path(run_dir) / RUN_FILE, RUN_DOCUMENT, asdict(self))

    @classmethod
    def load(cls, run_dir: str | Path) -> TaskOptions:
        return read_fields(
            Path(run_dir) / RUN_FILE, RUN_DOCUMENT, f"{run_dir} is not a progression run (no "
            f"{RUN_FILE}): train it with `sheepop progression train`",
            lambda d: cls(int(d["digits"]), int(d["window_terms"]), bool(d["reverse_digits"]),
                          int(d["mask_given"]), str(d.get("data", "")),
                          bool(d.get("both_ways", False))))


def task_dataset(data: Progressions, opts: TaskOptions) -> tuple[Dataset, TermWindows,
                                                                 TermWindows]:
    """The trainer's Dataset (flat streams, for its bookkeeping) and the train/val windows."""
    train = TermWindows(data.train, data.digits, opts.window_terms, opts.reverse_digits,
                        opts.mask_given, opts.both_ways)
    val = TermWindows(data.heldout, data.digits, opts.window_terms, opts.reverse_digits,
                      opts.mask_given)
    report = [f"data: {opts.data or 'progressions'}: {len(data.train):,} train and "
              f"{len(data.heldout):,} held-out sequences of {data.digits}-digit terms",
              f"windows: {opts.window_terms} terms ({opts.block_size} tokens), "
              f"{len(train):,} train starts, digits "
              f"{'least' if opts.reverse_digits else 'most'} significant first, loss on "
              f"{'terms after the first ' + str(opts.mask_given) if opts.mask_given else 'all'}"
              + (", each sequence also read backwards" if opts.both_ways else "")]
    dataset = Dataset(flat_stream(data.train, data.digits, opts.reverse_digits),
                      flat_stream(data.heldout, data.digits, opts.reverse_digits),
                      DigitsTokenizer(), report)
    return dataset, train, val


def seconds_per_step(cfg: Config, windows: TermWindows, steps: int = 6) -> float:
    """Median wall time of an optimizer step of a throwaway engine (after one warm-up step)."""
    from sheepop.train.start import make_engine
    engine = make_engine(cfg)
    sampler = TermWindowSampler(windows, cfg.train.batch_size, cfg.train.seed + 1)
    times = []
    for i in range(steps + 1):
        micro = [sampler.next_batch() for _ in range(cfg.train.grad_accum)]
        t0 = time.perf_counter()
        engine.train_step(micro, cfg.train.lr)
        if i:
            times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def derive_settings(cfg: Config, opts: TaskOptions, base: Config | None = None) -> None:
    """Set what the task derives: the context, block_size = m (D + 1) - 1 for m-term windows of
    D-digit terms, and the digits tokenizer. A value the user changed from `base` (the preset or
    the saved run the config started from) that contradicts the derived one is an error, never
    silently replaced (as `resolve_vocab_size` does for the vocabulary)."""
    derived = {("model", "block_size"): opts.block_size, ("data", "tokenizer"): "digits"}
    for (section, key), value in derived.items():
        asked = getattr(getattr(cfg, section), key)
        if base is not None and asked not in (value, getattr(getattr(base, section), key)):
            raise UserError(f"{section}.{key} is {asked!r} but the progression task derives "
                            f"{value!r} (from --window-terms and the data's digits): leave "
                            f"{section}.{key} unset")
        setattr(getattr(cfg, section), key, value)


def train(data: Progressions, cfg: Config, opts: TaskOptions, run_dir: str | Path,
          minutes: float | None = None, resume: bool = False, progress: bool = True,
          log=print, base: Config | None = None) -> Any:
    """Train on `data` and return the trainer's Summary (plots written into `run_dir`).
    `base`: the config before the user's changes, to tell derived settings apart from
    contradicting ones (`derive_settings`)."""
    from sheepop.train.plots import write_run_plots
    from sheepop.train.start import setup
    run_dir = Path(run_dir)
    if resume:
        saved = TaskOptions.load(run_dir)
        if saved.digits != data.digits:
            raise UserError(f"{run_dir} was trained on {saved.digits}-digit terms, the data has "
                            f"{data.digits}")
        opts = saved
    elif (run_dir / checkpoint.MODEL_FILE).exists():  # say so before calibrating
        raise UserError(f"{run_dir} already holds a run: continue it with --resume or choose "
                        "another --out")
    derive_settings(cfg, opts, base)
    dataset, train_windows, val_windows = task_dataset(data, opts)
    if minutes and not resume:
        cfg.validate()
        resolve_vocab_size(cfg.model, dataset.tokenizer.vocab_size, "the digits tokenizer")
        t0 = time.perf_counter()
        per_step = seconds_per_step(cfg, train_windows)
        budget = 60 * minutes - (time.perf_counter() - t0)
        cfg.train.steps = max(1, int(0.97 * budget / per_step))
        cfg.train.max_minutes = budget / 60
        log(f"calibration: {per_step * 1000:.0f} ms/step, so {cfg.train.steps:,} steps fit "
            f"in {budget / 60:.1f} minutes")
    # The shared trainer would cut windows anywhere in a flat stream; this task trains on
    # term-aligned windows with the given terms masked, so it brings its own sampler (whose
    # state the trainer saves and restores on resume) and validation windows.
    sampler = TermWindowSampler(train_windows, cfg.train.batch_size, cfg.train.seed)
    eval_data = val_windows.fixed(cfg.train.eval_batches * cfg.train.batch_size)
    trainer = setup(None, cfg, run_dir, resume=resume, log=log, progress=progress,
                    dataset=dataset, sampler=sampler, eval_data=eval_data)
    opts.save(run_dir)
    summary = trainer.run()
    write_run_plots(run_dir, cfg.train)
    return summary
