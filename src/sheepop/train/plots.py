"""Plots written into a run directory at the end of training: loss.png and lr.png."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, never a window
import matplotlib.pyplot as plt  # noqa: E402

from sheepop.config.schema import TrainConfig  # noqa: E402
from sheepop.files import atomic_write_bytes  # noqa: E402
from sheepop.schedule import lr_for  # noqa: E402


def read_metrics(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip()]


def _save(fig, path: Path) -> None:
    import io
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


def plot_loss(metrics: list[dict], path: str | Path, title: str = "loss") -> None:
    fig, ax = plt.subplots(figsize=(6.4, 4))
    train = [(r["step"], r["loss"]) for r in metrics if "loss" in r]
    val = [(r["step"], r["val_loss"]) for r in metrics if "val_loss" in r]
    if train:
        ax.plot(*zip(*train), label="train", lw=1)
    if val:
        ax.plot(*zip(*val), "o-", label="val", ms=3)
    ax.set(xlabel="step", ylabel="cross-entropy (nats/token)", title=title)
    ax.grid(alpha=0.3)
    ax.legend()
    _save(fig, Path(path))


def plot_lr(cfg: TrainConfig, path: str | Path) -> None:
    steps = list(range(cfg.steps))
    fig, ax = plt.subplots(figsize=(6.4, 3))
    ax.plot(steps, [lr_for(s, cfg) for s in steps], lw=1.5)
    ax.set(xlabel="step", ylabel="learning rate",
           title=f"warmup {cfg.warmup_steps} steps, cosine to {cfg.min_lr:g}")
    ax.grid(alpha=0.3)
    _save(fig, Path(path))


def write_run_plots(run_dir: str | Path, cfg: TrainConfig) -> None:
    run_dir = Path(run_dir)
    plot_loss(read_metrics(run_dir / "metrics.jsonl"), run_dir / "loss.png")
    plot_lr(cfg, run_dir / "lr.png")
