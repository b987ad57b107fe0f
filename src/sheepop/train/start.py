"""Starting a run: the run directory's lock and recovery, the data, the engine, and the state of
a resumed run; `setup` returns the `Trainer` (sheepop.train.loop) ready to `run`.

Fresh or resumed, the writer (rank 0 under torchrun) first takes the run directory's lock, so
two trainings never write into one (sheepop.train.run_lock), then finishes or drops a save that a
crash interrupted (`checkpoint.recover`): "holds a run" means holds a committed checkpoint. A
resumed run trains on the data it recorded unless DATA is given (sheepop.data.source), and its
metrics after the resumed step are dropped (they are written again).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from sheepop import files, threads
from sheepop.arch.lora import LoraConfig
from sheepop.checkpoint import format as checkpoint
from sheepop.config.model_size import describe_kv_cache, param_count
from sheepop.config.schema import Config, TrainConfig, resolve_vocab_size
from sheepop.data import source as data_source
from sheepop.data.dataset import Dataset, load_dataset
from sheepop.errors import UserError
from sheepop.tokenizers import loads as load_tokenizer
from sheepop.train import run_lock, signals
from sheepop.train.allocator import keep_freed_memory
from sheepop.train.init_from import (
    WITH_RESUME,
    Source,
    evaluate_start,
    open_source,
    saved_record,
    start_from,
    unknown_warning,
    with_record,
)
from sheepop.train.loop import Engine, Trainer
from sheepop.train.same_model import check_same_model
from sheepop.words import plural


def make_engine(cfg: Config, weights: dict[str, np.ndarray] | None = None,
                lora: LoraConfig | None = None,
                adapters: dict[str, np.ndarray] | None = None) -> Engine:
    """The engine of `cfg.train.engine` on `weights` (None: fresh ones). With `lora`, the
    weights are frozen and only the adapters train (`adapters`: a checkpoint's, None: new)."""
    with signals.deferred():  # a signal during torch's import could abort it (signals.py)
        return _make_engine(cfg, weights, lora, adapters)


def _make_engine(cfg: Config, weights: dict[str, np.ndarray] | None, lora: LoraConfig | None,
                 adapters: dict[str, np.ndarray] | None) -> Engine:
    kw = {} if lora is None else {"lora": lora, "adapters": adapters}
    threads.apply(cfg.train.threads)  # torch's and the BLAS's, before the engine loads torch
    keep_freed_memory()  # each step reuses what the last freed, not fresh pages (allocator.py)
    if cfg.train.engine == "numpy":
        from sheepop.train.engine_numpy import NumpyEngine
        return NumpyEngine(cfg.model, cfg.train, weights, **kw)
    from sheepop.train.engine_torch import TorchEngine
    engine = TorchEngine(cfg.model, cfg.train, weights, **kw)
    threads.apply_to_torch()  # its inter-op pool, which no environment variable sizes
    return engine



def refuse_run_as_data(data_path: str | Path | None) -> None:
    """A run directory given as DATA (`sheepop train runs/mine`, a natural guess at "continue
    my run") would train a new model on its JSON files: refused, with the commands meant."""
    if data_path is None or not Path(data_path).is_dir() or not checkpoint.holds_checkpoint(
            data_path):
        return
    run = shlex.quote(str(data_path))
    raise UserError(f"DATA {run} is a run directory (it holds a model), not text to train on: "
                    f"to continue that run, sheepop train --resume --out {run}; to start a new "
                    f"run from its model, sheepop train [DATA] --init-from {run} --out NEW_RUN")


def schedule_warning(train: TrainConfig) -> str | None:
    """The learning rate's warmup takes train.steps or more: it only rises and never decays
    (sheepop.schedule), a silent surprise for a short run; None when it decays."""
    if train.steps > train.warmup_steps:
        return None
    return (f"train.steps ({train.steps}) is not above train.warmup_steps "
            f"({train.warmup_steps}): the learning rate only warms up, to "
            f"{train.steps / train.warmup_steps:.0%} of train.lr, and never decays (lower it: "
            f"--set train.warmup_steps=N)")


def _truncate_metrics(path: Path, step: int) -> None:
    """Keep the metrics of steps <= `step` (a resumed run rewrites what came after)."""
    if not path.exists():
        return
    keep = [line for line in path.read_text(encoding="utf-8").splitlines()
            if (row := _metrics_row(line)) is not None and row["step"] <= step]
    files.atomic_write_text(path, "".join(line + "\n" for line in keep))


def _metrics_row(line: str) -> dict[str, Any] | None:
    """One row of metrics.jsonl, or None for a line torn by a crash (or a full disk)."""
    try:
        row = json.loads(line)
    except ValueError:
        return None
    return row if isinstance(row, dict) and isinstance(row.get("step"), int) else None


def setup(data_path: str | None, cfg: Config, run_dir: str | Path, resume: bool = False,
          log=print, is_main: bool = True, **options: Any) -> Trainer:
    """Load data and (when resuming) the run's state; build the engine and the trainer.

    The writer (rank 0 under torchrun) first takes the run directory's lock, so two trainings
    never write into one (sheepop.train.run_lock), then finishes or drops a save that a crash
    interrupted (`checkpoint.recover`): "holds a run" means holds a committed checkpoint. The
    trainer lets the lock go when its `run` ends; a failed start lets it go at once.

    `options`: `progress`; a task that builds its own token streams (e.g. the progression
    task) passes `dataset` instead of `data_path`, and may pass its own `sampler` and
    `eval_data` windows; under torchrun, `wrap_engine` puts the engine under DDP or FSDP
    (sheepop.train.distributed) before any optimizer state is loaded. Fine-tuning passes
    `initial_weights` (a new run starts from them) and `lora` (they stay frozen, the
    checkpoint holds the adapters: a resumed LoRA run needs the same `initial_weights`).
    `init_from`: a run directory whose model, tokenizer and weights the new run starts from,
    with a new optimizer at step 0 (sheepop.train.init_from; `cfg` from `init_config`).
    `trainer_class`: a `Trainer` whose evaluation is a task's own (DPO's held-out pairs).
    """
    run_dir = Path(run_dir)
    source = None
    if options.get("init_from") is not None:  # checked before the lock writes into run_dir
        if resume:
            raise UserError(WITH_RESUME)
        source = open_source(options["init_from"], run_dir)
    options["init_from"] = source
    lock = run_lock.acquire(run_dir) if is_main else None
    try:
        if lock is not None:
            checkpoint.recover(run_dir)
        trainer = _setup(data_path, cfg, run_dir, resume, log, is_main, **options)
    except BaseException:
        if lock is not None:
            lock.release(undo=True)
        raise
    trainer.run_lock = lock
    return trainer


def _setup(data_path: str | None, cfg: Config, run_dir: Path, resume: bool, log, is_main: bool,
           progress: bool = True, dataset: Dataset | None = None,
           wrap_engine: Callable[[Engine], Engine] | None = None, sampler=None,
           eval_data: tuple[np.ndarray, np.ndarray] | None = None,
           initial_weights: dict[str, np.ndarray] | None = None,
           lora: LoraConfig | None = None, init_from: Source | None = None,
           trainer_class: type[Trainer] = Trainer) -> Trainer:
    source = init_from
    weights, tokenizer, arrays, state = initial_weights, None, None, None
    if resume:
        if not checkpoint.holds_checkpoint(run_dir):
            raise UserError(f"--resume: no checkpoint in {run_dir}")
        tokenizer = load_tokenizer(checkpoint.load_tokenizer_json(run_dir),
                                   str(run_dir / checkpoint.TOKENIZER_FILE))
        saved = checkpoint.load_weights(run_dir)
        weights = weights if lora is not None else saved
        arrays, state = checkpoint.load_trainer_state(run_dir)
        if dataset is None:  # the data the run recorded, unless DATA is given
            data_path = data_source.for_resume(data_path, state.get("data"), run_dir, log)
    elif checkpoint.holds_checkpoint(run_dir):
        raise UserError(f"{run_dir} already holds a run: continue it with --resume or choose "
                        "another --out")
    if source is not None:
        cfg, tokenizer, weights = start_from(source, cfg, data_path, log)
    elif resume and (record := saved_record(run_dir)) is not None:
        cfg = with_record(cfg, record)  # kept in the checkpoints to come
    cfg.validate()
    if cfg.data.val_data:  # recorded absolute, so --resume finds it from any folder
        cfg.data.val_data = str(Path(cfg.data.val_data).absolute())
    if resume:  # before the data is read: a changed model is refused in words
        check_same_model(run_dir, cfg.model)
    data = dataset if dataset is not None else load_dataset(data_path, cfg.data, tokenizer)
    resolve_vocab_size(cfg.model, data.tokenizer.vocab_size, "the tokenizer")
    cfg.validate()
    for line in data.report:
        log(line)
    if (source is not None or resume) and (warning := unknown_warning(data, data_path)):
        log(warning)
    engine = make_engine(cfg, weights, lora, saved if resume and lora is not None else None)
    if wrap_engine is not None:
        engine = wrap_engine(engine)
    start = 0
    if resume:
        if (saved_with := state.get("optimizer", "adamw")) != cfg.train.optimizer:
            raise UserError(f"{files.shown(run_dir)} was trained with train.optimizer="
                            f"{saved_with}: resume it with the same (its state holds no "
                            f"{cfg.train.optimizer} buffers)")
        engine.load_optimizer_arrays(arrays, state)
        start = int(state["step"])
        log(f"resuming {run_dir} at step {start}")
    if is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        _truncate_metrics(run_dir / "metrics.jsonl", start)
    model = param_count(cfg.model)  # the model's own, as generate and chat count it
    log(f"model: {model:,} parameters ({plural(cfg.model.n_layer, 'layer')}, "
        f"{plural(cfg.model.n_head, 'head')}, width {cfg.model.n_embd}, context "
        f"{cfg.model.block_size}), "
        f"{describe_kv_cache(cfg.model)}; {engine.description}")
    if lora is not None:  # the adapters beside the model's parameters, never among them
        adapters = engine.num_params() - model
        log(f"LoRA rank {lora.rank}, alpha {lora.alpha:g} on {', '.join(lora.targets)}: "
            f"{adapters:,} adapter parameters ({100 * adapters / model:.2f}% of the model's), "
            f"{engine.trainable_params():,} trained")
    trainer = trainer_class(cfg, data, run_dir, engine, start, state, log, is_main, progress,
                            sampler, eval_data)
    if source is not None:
        evaluate_start(trainer, source, log)
    return trainer
