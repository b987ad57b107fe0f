"""A real run to spoil: a 1-layer model of width 16 trained 2 steps on a pangram, saved with its
trainer state (the hostile- and misleading-file tests take copies of it)."""

from __future__ import annotations

from pathlib import Path

from sheepop.config.build import build_config
from sheepop.train.start import setup

TEXT = "the quick brown fox jumps over the lazy dog. " * 40


def train_tiny_run(root: Path, block_size: int) -> Path:
    """root/run, trained on root/data.txt (TEXT), context `block_size`."""
    (root / "data.txt").write_text(TEXT)
    cfg = build_config(None, None, [
        "model.n_layer=1", "model.n_head=2", "model.n_embd=16", f"model.block_size={block_size}",
        "train.batch_size=2", "train.steps=2", "train.eval_batches=1", "train.device=cpu",
        "train.dtype=float32", "train.warmup_steps=0", "data.val_fraction=0.1"])
    setup(str(root / "data.txt"), cfg, root / "run", progress=False, log=lambda *_: None).run()
    return root / "run"
