"""How a trainer writes its checkpoints, with the rules that keep the one on disk a good one
(sheepop.train.divergence): a checkpoint due at step s is kept in memory and written once step
s+1 is sound (`_snapshot` then `_commit`, from the loop in sheepop.train.loop); the last save of
a run, which no step follows, is probed on the last step's batch first (`save`, `_probe`);
weights that are not finite are never written; the best model goes to best/
(sheepop.train.keeping); and a write the system refuses is one line naming the checkpoint that
stands (`_save_failed`).

`CheckpointSaving` is a part of `sheepop.train.loop.Trainer` (its base class), split off along
this seam; it uses the trainer's attributes: cfg, data, run_dir, engine, sampler, step, best,
is_main, agree, diverged, saved_step, resumed_step, last_val, last_val_bpb and the probe's
_last_batch, _last_loss, _max_loss, _pending, _step_start_sampler.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sheepop.checkpoint import format as checkpoint
from sheepop.errors import UserError
from sheepop.train import divergence, keeping


class CheckpointSaving:
    """The saving half of the trainer (see the module's docstring)."""

    cfg: Any
    data: Any
    run_dir: Any
    engine: Any
    sampler: Any
    step: int
    best: keeping.Best
    is_main: bool
    agree: Any
    diverged: str | None
    saved_step: int | None
    resumed_step: int | None
    last_val: float | None
    last_val_bpb: float | None
    _last_batch: Any
    _last_loss: float
    _max_loss: float
    _pending: Any
    _step_start_sampler: Any

    def save(self) -> None:
        """The last save of a run (its end, Ctrl-C, a signal): no step follows it, so the loss
        of its weights on the last step's batch must be finite and bounded (`_probe`)."""
        self._pending = None  # superseded: this save is of the same step or a later one
        saved = self._snapshot()
        self.diverged = self._probe()
        if self.diverged is not None and self.is_main:
            raise UserError(self._stopped(self.step, self.diverged))
        if saved is not None:
            self._commit(self.step, saved)

    def _snapshot(self) -> tuple[Any, ...] | None:
        """This step's checkpoint in memory, as `checkpoint.save_checkpoint`'s arguments after
        the run directory, its arrays copied (None on ranks > 0); a run whose weights are no
        longer finite, or that diverged, stops here with its one line."""
        # Every rank gathers (FSDP's shards are collected by all); rank 0 alone writes.
        arrays, info = self.engine.optimizer_arrays()
        weights = self.engine.weights()
        if not self.is_main:
            return None
        # Interrupted inside a step: save the sampler as it was before that step's batches.
        sampler = self.sampler.state(self._step_start_sampler)
        state = {"step": self.step, "engine": self.engine.name, "sampler": sampler,
                 "optimizer": self.cfg.train.optimizer,
                 **self.best.to_state(), **info}
        if self.data.source is not None:  # what DATA was, for --resume (sheepop.data.source)
            state["data"] = self.data.source
        if self.diverged is None and not divergence.finite(weights):
            self.diverged = "the weights are no longer finite numbers"
        if self.diverged is not None:  # never over a good checkpoint (the Ctrl-C path too)
            raise UserError(self._stopped(self.step, self.diverged))
        # (copies: an engine may hand out its live arrays, which the next step updates)
        return ({k: np.array(v, copy=True) for k, v in weights.items()}, self.cfg.to_dict(),
                self.data.tokenizer.to_json(),
                {k: np.array(v, copy=True) for k, v in arrays.items()}, state)

    def _commit(self, step: int, saved: tuple[Any, ...]) -> None:
        """Write the checkpoint `_snapshot` made at `step`."""
        try:
            checkpoint.save_checkpoint(self.run_dir, *saved)
        except checkpoint.SaveFailed as e:
            raise UserError(self._save_failed(e, step=step)) from None
        self.saved_step = step
        keeping.keep_copy(self.run_dir, step, self.cfg.train.keep_last)

    def _probe(self) -> str | None:
        """What is wrong with the weights about to be saved last (None: nothing), from their
        loss on the last step's batch; every rank measures, and all stop if any is wrong."""
        if self._last_batch is None:
            return None  # no step ran in this process: the weights are those it loaded
        total, count = self.engine.eval_loss(*self._last_batch)
        loss = total / max(count, 1)
        bound = divergence.probe_bound(self.data.tokenizer.vocab_size, self._max_loss)
        why = divergence.probe_problem(loss, self._last_loss, bound)
        if self.agree(why is not None):
            return why or "the update blew up on another rank"
        return None

    def _stopped(self, step: int, what: str, measured_before: bool = False) -> str:
        """The one line of a divergence at `step`; `measured_before`: found by the step's own
        check, on the weights it started from (those of the kept checkpoint when it is the
        first step after a resume), not on the weights it made."""
        resumed = self.saved_step is not None and self.saved_step == self.resumed_step
        first = resumed and measured_before and step == self.saved_step + 1
        return divergence.stopped_message(step, what, self.run_dir, self.saved_step,
                                          self.cfg.train.lr, first, resumed and not first)

    def _save_best(self) -> None:
        weights = self.engine.weights()  # every rank: FSDP gathers its shards
        if not self.is_main or not divergence.finite(weights):
            return  # (weights that are not finite: the next save stops the run, naming why)
        try:
            keeping.save_best(self.run_dir, weights, self.cfg.to_dict(),
                              self.data.tokenizer.to_json(), self.step, self.last_val,
                              self.last_val_bpb)
        except checkpoint.SaveFailed as e:
            failed = checkpoint.SaveFailed(self.run_dir, e.reason, committed=False)
            raise UserError(self._save_failed(failed, "saving the best model")) from None

    def _save_failed(self, e: checkpoint.SaveFailed, what: str = "saving the checkpoint",
                     step: int | None = None) -> str:
        """The one line of a write the system refused (disk full, I/O error)."""
        resume = f"`sheepop train --resume --out {self.run_dir}`"
        step = self.step if step is None else step
        if e.committed:
            kept = f"the checkpoint of step {step} is committed: {resume} completes it"
        elif self.saved_step is None:
            kept = "no checkpoint was kept (it was the first): free space, then start again"
        else:
            kept = (f"the checkpoint of step {self.saved_step} is intact: free space, then "
                    f"continue with {resume}")
        return (f"{what} of step {step} in {self.run_dir} failed: "
                f"{e.reason}; {kept}")
