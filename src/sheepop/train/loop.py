"""The training loop, the same for both engines.

For each optimizer step s: lr = lr_for(s) (warmup + cosine), draw `grad_accum` micro-batches,
let the engine do forward, backward, clipping and the AdamW update; every `eval_interval` steps
measure the validation loss on a fixed set of windows; every `checkpoint_interval` steps write a
checkpoint, once the step after it is sound (sheepop.train.saving). Metrics go to
`metrics.jsonl` (the validation loss also in bits per byte of the val text, `val_bpb`:
sheepop.tokenizers.token_bytes), and with train.tensorboard to TensorBoard
event files (sheepop.train.tensorboard); plots are drawn at the end. Each evaluation that lowers
the val loss replaces the best model in best/, and train.keep_last keeps the newest checkpoints;
train.early_stop_patience evaluations without a new best stop the run (sheepop.train.keeping),
and the first evaluation at or below train.target_val_loss stops it too: the summary says at
which step and after how many seconds (the time to a target loss).
While it trains the run shows a bar on a terminal, plain lines elsewhere
(sheepop.train.progress). Ctrl-C,
SIGTERM or SIGHUP lets the step in progress finish, then writes a checkpoint of it and stops cleanly
(sheepop.train.signals); `--resume` continues from it so that the losses are those of an
uninterrupted run, step for step.

An engine is any object with `train_step(micro_batches, lr) -> (loss, grad_norm)`,
`eval_loss(x, y) -> (loss_sum, count)`, `weights()`, `optimizer_arrays()`,
`load_optimizer_arrays(arrays, info)`, `num_params()` and `description`.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TextIO

import numpy as np

from sheepop.checkpoint import format as checkpoint
from sheepop.config.schema import Config
from sheepop.data.dataset import Dataset
from sheepop.data.windows import WindowSampler, eval_windows
from sheepop.errors import UserError
from sheepop.files import open_own_append
from sheepop.schedule import lr_for
from sheepop.tokenizers.token_bytes import (
    TargetBytes,
    bits_per_byte,
    perplexity,
    scored_text_bytes,
)
from sheepop.train import divergence, keeping, run_lock
from sheepop.train.progress import Progress, evaluation_line
from sheepop.train.saving import CheckpointSaving
from sheepop.train.signals import StopRequest, signal_name
from sheepop.train.summary import Summary
from sheepop.train.tensorboard import EventWriter


class Engine(Protocol):
    name: str
    description: str

    def train_step(self, micro_batches: list[tuple[np.ndarray, np.ndarray]], lr: float
                   ) -> tuple[float, float]: ...
    def eval_loss(self, x: np.ndarray, y: np.ndarray) -> tuple[float, int]: ...
    def weights(self) -> dict[str, np.ndarray]: ...
    def optimizer_arrays(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]: ...
    def load_optimizer_arrays(self, arrays: dict[str, np.ndarray], info: dict[str, Any]
                              ) -> None: ...
    def num_params(self) -> int: ...


class Trainer(CheckpointSaving):
    def __init__(self, cfg: Config, data: Dataset, run_dir: Path, engine: Engine,
                 start_step: int = 0, state: dict[str, Any] | None = None, log=print,
                 is_main: bool = True, progress: bool | str = True, sampler=None,
                 eval_data: tuple[np.ndarray, np.ndarray] | None = None,
                 progress_stream: TextIO | None = None):
        self.cfg, self.data, self.run_dir, self.engine = cfg, data, run_dir, engine
        self.step, self.log, self.is_main, self.progress = start_step, log, is_main, progress
        self.progress_stream = progress_stream  # None: standard error (sheepop.train.progress)
        m, t, d = cfg.model, cfg.train, cfg.data
        pad = data.tokenizer.pad_id if data.tokenizer.pad_id is not None else 0
        # A task may bring its own sampler (next_batch, snapshot, state, set_state) and fixed
        # evaluation windows; by default windows are cut anywhere in the flat token stream.
        self.sampler = sampler or WindowSampler(data.train, m.block_size, t.batch_size, t.seed,
                                                d.sampling, d.stride, pad)
        self.eval_x = self.eval_y = None
        if eval_data is not None:
            self.eval_x, self.eval_y = eval_data
        elif len(data.val) > 1:
            self.eval_x, self.eval_y = eval_windows(data.val, m.block_size,
                                                    t.eval_batches * t.batch_size, pad)
        # The windows are fixed, so the bytes of text their targets stand for are counted once.
        self.eval_bytes = self._eval_bytes(data)
        self.best = keeping.Best.from_state(state)
        self.last_val: float | None = None
        self.last_val_bpb: float | None = None
        if state is not None:
            self.sampler.set_state(state["sampler"])
        self.metrics_path = run_dir / "metrics.jsonl"
        # Under torchrun (sheepop.train.distributed): the number of processes, for the whole
        # job's tokens/s, and the ranks' joint decision to stop, which every rank follows.
        self.world_size = 1
        self.agree: Callable[[bool], bool] = bool
        self._step_start_sampler: dict[str, Any] | None = None
        # The step of the checkpoint on disk (None: none yet), what made the run diverge (None:
        # it has not), and this writer's lock on run_dir (set by `setup`; None on ranks > 0).
        self.saved_step: int | None = start_step if state is not None else None
        self.resumed_step = self.saved_step
        self.diverged: str | None = None
        # A checkpoint waiting for the step after it (sheepop.train.divergence): (its step,
        # what `_snapshot` made) on rank 0. The last step's batch, its loss and the highest
        # loss seen: what the final save's probe measures against.
        self._pending: tuple[int, tuple[Any, ...]] | None = None
        self._last_batch: tuple[np.ndarray, np.ndarray] | None = None
        self._last_loss, self._max_loss = math.nan, 0.0
        self.run_lock: run_lock.RunLock | None = None
        # The scalars also as TensorBoard events (rank 0); checked here, before any step.
        self.events = (EventWriter(run_dir, start_step) if t.tensorboard and is_main else None)


    def _eval_bytes(self, data: Dataset) -> int:
        """The bytes of text the evaluation windows' targets stand for. Over raw text that a
        run's tokenizer does not fully know (--resume, --init-from on new data), the bytes its
        tokens cannot write are spread over the scored targets, as `sheepop eval` counts them
        (sheepop.tokenizers.token_bytes.scored_text_bytes): bits per byte over the real text."""
        if self.eval_x is None:
            return 0
        target_bytes = TargetBytes(data.tokenizer)
        if not data.unknown or data.text_bytes is None:
            return target_bytes.count(self.eval_x, self.eval_y)
        stream = np.concatenate([np.asarray(data.train), np.asarray(data.val)])
        return scored_text_bytes(target_bytes, self.eval_x, self.eval_y, stream, data.text_bytes)
    def evaluate(self) -> tuple[float, float | None] | None:
        """(mean loss in nats/token, bits per byte) on the validation windows; None without
        them. Bits per byte = sum of nats / (ln 2 * bytes of the targets' text)."""
        if self.eval_x is None:
            return None
        B, total, count = self.cfg.train.batch_size, 0.0, 0
        for i in range(0, len(self.eval_x), B):
            s, n = self.engine.eval_loss(self.eval_x[i:i + B], self.eval_y[i:i + B])
            total, count = total + s, count + n
        return total / max(count, 1), bits_per_byte(total, self.eval_bytes)

    def _evaluate(self, record: dict[str, Any], shown: Progress) -> bool:
        """Measure the val loss into `record`; a new best replaces best/. Whether the run has
        spent its train.early_stop_patience (False without a validation split)."""
        val = self.evaluate()
        if val is None:
            return False
        self.last_val, self.last_val_bpb = val
        record.update(evaluation_record(*val))
        improved = self.best.update(self.last_val, self.step)
        if improved:
            self._save_best()
        shown.note(evaluation_line(self.step, self.cfg.train.steps, self.last_val,
                                   self.last_val_bpb, improved, self.best.val,
                                   self.best.step, self.best.stale))
        return self.best.patience_spent(self.cfg.train.early_stop_patience)

    def _append_metrics(self, record: dict[str, Any]) -> None:
        if self.events is not None:
            self.events.write(record)
        if self.is_main:
            try:
                with open_own_append(self.metrics_path) as f:  # never through a link
                    f.write(json.dumps(record) + "\n")
            except OSError as e:  # e.g. a full disk: stop with one line, the checkpoint kept
                failed = checkpoint.SaveFailed(self.run_dir, checkpoint.describe_os_error(e),
                                               committed=False)
                raise UserError(self._save_failed(failed, "writing the metrics")) from None

    def run(self) -> Summary:
        """Train to train.steps (or until stopped), then let go of the run's lock."""
        try:
            return self._train()
        finally:
            if self.events is not None:
                self.events.close()
            if self.run_lock is not None:
                self.run_lock.release()

    def _train(self) -> Summary:
        t = self.cfg.train
        # Tokens are counted as the batches hold them: a window is block_size long, but a batch
        # of conversations is only as long as its longest one (SmolLM2's 8,192-token context
        # against ~40-token conversations would overstate the rate 200 times).
        tokens = 0
        t0 = time.perf_counter()
        if self.step >= t.steps:
            raise UserError(f"the run is already at step {self.step} of train.steps={t.steps}: "
                            "give a larger --steps to continue it")
        loss = float("nan")
        interrupted, stopped_early = False, 0
        reached: tuple[int, float] | None = None  # (step, seconds) of train.target_val_loss
        shown = Progress(self.progress if self.is_main else "off", t.steps, self.step,
                         t.log_interval, self.progress_stream, 60 * t.max_minutes)
        # Signals are recorded, not raised, from here to the end of the last save: a step is
        # never torn and a save always completes (sheepop.train.signals).
        with StopRequest() as stop:
            try:
                while self.step < t.steps:
                    lr = lr_for(self.step, t)
                    self._step_start_sampler = self.sampler.snapshot()
                    micro = [self.sampler.next_batch() for _ in range(t.grad_accum)]
                    tokens += sum(x.size for x, _ in micro) * self.world_size
                    loss, norm = self.engine.train_step(micro, lr)
                    self._step_start_sampler = None
                    self.diverged = divergence.problem(loss, norm, t)
                    if self.diverged is not None:  # stop before anything saves these weights
                        self._pending = None  # nor those of the step before: they led here
                        raise UserError(self._stopped(self.step + 1, self.diverged, True))
                    if self._pending is not None:  # the step after it was sound: it is good
                        self._commit(*self._pending)
                        self._pending = None
                    self._last_batch, self._last_loss = micro[-1], loss
                    self._max_loss = max(self._max_loss, loss)
                    self.step += 1
                    elapsed = time.perf_counter() - t0
                    # (rounded once: the line shown and metrics.jsonl give the same figure)
                    rate = round(tokens / max(elapsed, 1e-9), 1)
                    record: dict[str, Any] = {"step": self.step, "loss": significant(loss),
                                              "lr": lr, "grad_norm": significant(norm),
                                              "tokens_per_sec": rate}
                    last = self.step == t.steps or bool(
                        t.max_minutes and self.agree(elapsed > 60 * t.max_minutes))
                    shown.step(self.step, loss, lr, rate, elapsed)
                    if (t.eval_interval and self.step % t.eval_interval == 0) or last:
                        spent = self._evaluate(record, shown)
                        # (the val loss is the same on every rank: all decide alike)
                        if t.early_stop_patience and self.agree(spent) and not last:
                            last, stopped_early = True, t.early_stop_patience
                        if t.target_val_loss and self.last_val is not None and self.agree(
                                self.last_val <= t.target_val_loss):
                            last, reached = True, (self.step, time.perf_counter() - t0)
                    if self.step % t.log_interval == 0 or "val_loss" in record or last:
                        self._append_metrics(record)
                    if last:
                        break
                    # Under torchrun every rank asks: all stop at one step if any was signalled.
                    if self.agree(stop.requested):
                        interrupted = True
                        if self.is_main:
                            why = signal_name(stop.signum) if stop.signum else "a signal to a rank"
                            shown.say(f"interrupted ({why}): saving a checkpoint of step "
                                      f"{self.step}")
                        break
                    if t.checkpoint_interval and self.step % t.checkpoint_interval == 0:
                        saved = self._snapshot()  # written once the next step is sound
                        self._pending = None if saved is None else (self.step, saved)
            except KeyboardInterrupt:  # raised by code, not by a signal (those are recorded)
                interrupted = True
                if self.is_main:
                    shown.say(f"interrupted: saving a checkpoint of step {self.step}")
            finally:
                shown.close()
            self.save()
        seconds = time.perf_counter() - t0
        rate = tokens / max(seconds, 1e-9)
        return Summary(self.step, seconds, loss, self.last_val, rate, interrupted, self.run_dir,
                       stop.signum if interrupted else None, self.last_val_bpb,
                       has_val=self.eval_x is not None,
                       best_val=None if math.isinf(self.best.val) else self.best.val,
                       best_step=self.best.step, stopped_early=stopped_early,
                       target=t.target_val_loss or None, reached=reached)


def significant(x: float) -> float:
    """x to 7 significant digits: short lines, yet a loss of 3e-7 is not logged as 0."""
    return float(f"{x:.7g}")


def evaluation_record(loss: float, bpb: float | None) -> dict[str, float]:
    """An evaluation's figures in a metrics.jsonl row: val_loss, val_perplexity (left out where
    e^loss is past float64's range: JSON has no infinity) and val_bpb (when bytes were
    counted)."""
    record = {"val_loss": significant(loss)}
    if math.isfinite(ppl := perplexity(loss)):
        record["val_perplexity"] = significant(ppl)
    if bpb is not None:
        record["val_bpb"] = significant(bpb)
    return record
