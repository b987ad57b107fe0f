"""TensorBoard event files of a run (`train.tensorboard = true` or `sheepop train
--tensorboard`): the scalars of metrics.jsonl, at the same steps, written through
`torch.utils.tensorboard` into RUN_DIR/tensorboard/. View them with `tensorboard --logdir runs`.

    metrics.jsonl    TensorBoard tag
    loss             train/loss
    lr               train/lr
    grad_norm        train/grad_norm
    tokens_per_sec   train/tokens_per_sec
    val_loss         val/loss
    val_perplexity   val/perplexity
    val_bpb          val/bits_per_byte

The `tensorboard` package is an optional extra (`pip install 'sheepop[tensorboard]'`): it brings
about 40 MB of dependencies (grpcio, protobuf, werkzeug) that training does not otherwise need.
A resumed run writes a new event file whose `purge_step` (the resumed step + 1) makes
TensorBoard drop the steps after it from the earlier files, as metrics.jsonl drops them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sheepop.errors import UserError

LOG_DIR = "tensorboard"
TAGS = {"loss": "train/loss", "lr": "train/lr", "grad_norm": "train/grad_norm",
        "tokens_per_sec": "train/tokens_per_sec", "val_loss": "val/loss",
        "val_perplexity": "val/perplexity", "val_bpb": "val/bits_per_byte"}
MISSING = ("train.tensorboard needs the tensorboard package: pip install 'sheepop[tensorboard]' "
           "(or pip install tensorboard)")


class EventWriter:
    """One session's TensorBoard writer for `run_dir`, which starts at step `start`."""

    def __init__(self, run_dir: Path, start: int):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # torch raises it when the tensorboard package is missing
            raise UserError(MISSING) from None
        self.writer = SummaryWriter(log_dir=str(run_dir / LOG_DIR), purge_step=start + 1)

    def write(self, record: dict[str, Any]) -> None:
        """One row of metrics.jsonl; flushed at an evaluation (and at close)."""
        for key, tag in TAGS.items():
            if key in record:
                self.writer.add_scalar(tag, record[key], record["step"])
        if "val_loss" in record:
            self.writer.flush()

    def close(self) -> None:
        self.writer.close()
