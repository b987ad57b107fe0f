"""What a run keeps besides its latest checkpoint: the model of the best validation loss, and
(train.keep_last > 1) the newest few checkpoints; and when to stop early.

    run_dir/best/                     model.safetensors config.json tokenizer.json best.json
    run_dir/checkpoints/step-0000500/ the five checkpoint files, as they were at step 500

best/ is written at each evaluation that lowers the validation loss, through the same
all-or-nothing save as a checkpoint (`checkpoint.commit_files` into the folder), so it is a
complete model directory: `sheepop generate RUN --best` (or `generate RUN/best`) loads it.
best.json (`sheepop-best`) says which step it is and its val loss. There is no optimizer state
in it: it is for using the model, not for resuming.

checkpoints/step-N/ holds hard links to the files of the checkpoint just committed (a link
costs no space: a later save replaces the run directory's files by new ones, renamed over them,
and the old ones live on through their links; where links are not possible, copies). The copy is
made under a temporary name and renamed into place, and only the newest keep_last stay.

Early stopping: `Best.stale` counts the evaluations since the best one; with
train.early_stop_patience = P the run stops after P evaluations in a row with no lower val loss.
"""

from __future__ import annotations

import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sheepop.arch.lora import LORA_FILE
from sheepop.checkpoint import format as checkpoint
from sheepop.errors import UserError
from sheepop.files import (
    DocumentFormat,
    atomic_write_bytes,
    check_own_entry,
    document_text,
    read_document,
)

BEST_RECORD = DocumentFormat("sheepop-best", 1, "sheepop best-checkpoint record")


@dataclass
class Best:
    """The lowest validation loss so far, the step it was measured at, and the evaluations
    since then."""

    val: float = math.inf
    step: int | None = None
    stale: int = 0

    def update(self, val: float, step: int) -> bool:
        """Record an evaluation; True when it is a new best (strictly lower)."""
        if val < self.val:
            self.val, self.step, self.stale = val, step, 0
            return True
        self.stale += 1
        return False

    def patience_spent(self, patience: int) -> bool:
        return patience > 0 and self.stale >= patience

    def to_state(self) -> dict[str, Any]:
        """Its part of trainer.json (best_val_loss was there before best_step and stale)."""
        return {"best_val_loss": None if math.isinf(self.val) else self.val,
                "best_step": self.step, "evals_since_best": self.stale}

    @classmethod
    def from_state(cls, state: dict[str, Any] | None) -> Best:
        state = state or {}
        val = state.get("best_val_loss")
        return cls(math.inf if val is None else float(val), state.get("best_step"),
                   int(state.get("evals_since_best") or 0))


def save_best(run_dir: Path, weights: dict[str, np.ndarray], config: dict[str, Any],
              tokenizer_json: str, step: int, val_loss: float, val_bpb: float | None) -> None:
    """Replace run_dir/best/ with this model, all or nothing (`checkpoint.SaveFailed`)."""
    record = document_text(BEST_RECORD, {"step": step, "val_loss": val_loss, "val_bpb": val_bpb})
    files = checkpoint.checkpoint_files(weights, config, tokenizer_json)
    best = run_dir / checkpoint.BEST_DIR
    check_own_entry(best, directory=True)  # a link: the save would go to where it points
    lora = run_dir / LORA_FILE
    if lora.is_file():  # adapters only: best/ names their base run as the run does
        best.mkdir(exist_ok=True)  # (before the commit: best/ never holds adapters without it)
        atomic_write_bytes(best / LORA_FILE, lora.read_bytes())
    checkpoint.commit_files(best, {**files, checkpoint.BEST_JSON: record.encode("utf-8")})


def best_dir(run_dir: str | Path) -> Path:
    """run_dir/best/, checked: a UserError that says why when the run has none."""
    path = Path(run_dir) / checkpoint.BEST_DIR
    if not checkpoint.holds_checkpoint(path):
        if not Path(run_dir).is_dir():
            raise UserError(f"run directory not found: {run_dir}")
        raise UserError(f"{run_dir} has no best checkpoint ({checkpoint.BEST_DIR}/ is written at "
                        "each evaluation that lowers the val loss: this run has not evaluated "
                        "on a validation split yet)")
    return path


def read_best(model_dir: str | Path) -> dict[str, Any]:
    """best.json of a best/ folder: {"step", "val_loss", "val_bpb"}."""
    path = checkpoint.current_path(model_dir, checkpoint.BEST_JSON)
    record = read_document(path, BEST_RECORD, f"{model_dir} has no {checkpoint.BEST_JSON}")
    step, val = record.get("step"), record.get("val_loss")
    if type(step) is not int or isinstance(val, bool) or not isinstance(val, (int, float)):
        raise UserError(f"{path}: \"step\" and \"val_loss\" must be numbers")
    return record


def keep_copy(run_dir: Path, step: int, keep_last: int) -> Path | None:
    """Link the checkpoint now in `run_dir` as checkpoints/step-NNNNNNN/ and delete all but the
    newest `keep_last` such folders (nothing when keep_last is 1); the folder, or None."""
    if keep_last <= 1:
        return None
    kept = run_dir / checkpoint.KEPT_DIR
    final, tmp = kept / f"step-{step:07d}", kept / f".step-{step:07d}.tmp"
    check_own_entry(kept, directory=True)  # a link: old copies would be deleted where it points
    try:
        kept.mkdir(exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        lora = (LORA_FILE,) if (run_dir / LORA_FILE).is_file() else ()  # adapters: their base
        for name in (*checkpoint.CHECKPOINT_FILES, *lora):
            source = checkpoint.current_path(run_dir, name)
            try:
                os.link(source, tmp / name)
            except OSError:  # a file system without hard links: a copy
                shutil.copy2(source, tmp / name)
        if final.exists():  # the same step saved again (resumed, then stopped at once)
            shutil.rmtree(final)
        os.replace(tmp, final)
        steps = sorted(p for p in kept.glob("step-*") if p.is_dir())
        for old in steps[:-keep_last]:
            shutil.rmtree(old)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise UserError(f"keeping a copy of the checkpoint of step {step} in {final} failed: "
                        f"{checkpoint.describe_os_error(e)}; the checkpoint itself is saved in "
                        f"{run_dir}") from None
    return final
