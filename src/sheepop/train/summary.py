"""The few lines a training run ends with (`Summary.lines`): how it ended, the losses, the best
checkpoint, and where the run is."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sheepop.checkpoint import format as checkpoint
from sheepop.tokenizers.token_bytes import perplexity
from sheepop.words import plural


@dataclass
class Summary:
    steps: int
    seconds: float
    train_loss: float
    val_loss: float | None
    tokens_per_sec: float
    interrupted: bool
    run_dir: Path
    signum: int | None = None  # the signal that interrupted the run (None: Ctrl-C or none)
    val_bpb: float | None = None  # the validation loss in bits per byte of the val text
    has_val: bool = True  # whether the data has a validation split (else nothing is evaluated)
    best_val: float | None = None  # the best val loss of the run (its model: best/)
    best_step: int | None = None
    stopped_early: int = 0  # the patience spent, when train.early_stop_patience stopped it
    target: float | None = None  # train.target_val_loss (None: off)
    reached: tuple[int, float] | None = None  # (step, seconds) when the val loss reached it

    def lines(self) -> list[str]:
        state = ("interrupted at" if self.interrupted else
                 "reached the target at" if self.reached else
                 "stopped early at" if self.stopped_early else "finished")
        lines = [f"{state} step {self.steps} in {self.seconds:.0f} s, "
                 f"{self.tokens_per_sec:,.0f} tokens/s",
                 f"train loss {self.train_loss:.4f}, {self._val()}"]
        if self.stopped_early:
            lines.append(f"stopped early: {plural(self.stopped_early, 'evaluation')} in a row "
                         "without a new best val loss (train.early_stop_patience)")
        if self.target is not None:
            lines.append(f"target val loss {self.target:g}: " + (
                f"reached at step {self.reached[0]}, after {self.reached[1]:.1f} s of training"
                if self.reached else "not reached"))
        if self.best_step is not None and self.best_val is not None:
            lines.append(f"best val loss {self.best_val:.4f} at step {self.best_step}, kept in "
                         f"{self.run_dir / checkpoint.BEST_DIR} (generate, chat, eval and "
                         "serve load it with --best)")
        lines.append(f"run saved in {self.run_dir}")
        return lines

    def _val(self) -> str:
        if self.val_loss is not None:
            bpb = f", {self.val_bpb:.4f} bits/byte" if self.val_bpb is not None else ""
            return (f"val loss {self.val_loss:.4f} (perplexity "
                    f"{perplexity(self.val_loss):.2f}{bpb})")
        if self.has_val:
            return "no val loss yet (stopped before this session's first evaluation)"
        return "no validation split"
