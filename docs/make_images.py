"""Make the pictures of docs/math/ from real runs: `make docs-images`.

    python docs/make_images.py                      # the real default runs (long on a small CPU)
    python docs/make_images.py --steps 300 --progression-minutes 3     # shortened runs
    python docs/make_images.py --tiny-run runs/tiny --progression-run runs/prog   # reuse runs

It trains (or reuses) two runs with the `sheepop` command line, then draws:

- loss_tiny.png         training and validation loss of `sheepop train --preset tiny`
- loss_progression.png  the same for `sheepop progression train` (the arithmetic-progression task)
- lr_schedule.png       the tiny preset's warmup + cosine schedule (sheepop.schedule.lr_for)
- positional_encoding.png   the sinusoidal table (sheepop.positional.sinusoidal_table)
- attention.png         attention weights of the trained tiny model on a line of Python
- next_token.png        its next-token probabilities after a prompt (sheepop.generation.sample)

A finished run in the work directory is reused, so a second call only redraws. Every picture is
written to a temporary name and renamed.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import subprocess
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, never a window
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from sheepop import files  # noqa: E402
from sheepop.checkpoint import format as checkpoint  # noqa: E402
from sheepop.config.build import build_config  # noqa: E402
from sheepop.config.schema import Config  # noqa: E402
from sheepop.generation.sample import probabilities  # noqa: E402
from sheepop.positional import sinusoidal_table  # noqa: E402
from sheepop.schedule import lr_for  # noqa: E402

DOCS = Path(__file__).resolve().parent
SENTENCE = "for i in range(len(items)):"
PROMPT = "    for i in range("


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", type=Path, default=DOCS / "images", help="where the PNGs go")
    p.add_argument("--work", type=Path, default=Path("runs/docs-images"),
                   help="where the runs are trained (reused when already finished)")
    p.add_argument("--steps", type=int, default=0,
                   help="train the tiny run for this many steps (0: the preset's 1500)")
    p.add_argument("--tiny-run", type=Path, help="use this finished run instead of training one")
    p.add_argument("--progression-run", type=Path, help="use this finished progression run")
    p.add_argument("--progression-minutes", type=float, default=10.0,
                   help="time budget of the progression run (its own default)")
    p.add_argument("--progression-steps", type=int, default=0,
                   help="train the progression run for this many steps instead of minutes")
    p.add_argument("--no-progression", action="store_true",
                   help="skip the progression task (its picture is left as it is)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's choice)")
    return p.parse_args(argv)


def sheepop(*args: str) -> None:
    """Run the sheepop command line in this interpreter; stop on failure."""
    cmd = [sys.executable, "-m", "sheepop", *args]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def finished(run_dir: Path) -> bool:
    """A run whose last checkpoint is its last step."""
    if not (run_dir / checkpoint.TRAINER_JSON).exists():
        return False
    state = json.loads((run_dir / checkpoint.TRAINER_JSON).read_text(encoding="utf-8"))
    return state.get("step") == run_config(run_dir).train.steps


def run_config(run_dir: Path) -> Config:
    saved = checkpoint.load_config(run_dir)
    return Config.from_dict({k: v for k, v in saved.items() if k in ("model", "train", "data",
                                                                       "sample")})


def tiny_run(args: argparse.Namespace) -> Path:
    if args.tiny_run:
        return args.tiny_run
    run = args.work / "tiny"
    if not finished(run):
        extra = ["--steps", str(args.steps)] if args.steps else []
        if args.threads:
            extra += ["--set", f"train.threads={args.threads}"]
        resume = ["--resume"] if (run / checkpoint.MODEL_FILE).exists() else []
        sheepop("train", "--preset", "tiny", "--out", str(run), "--no-progress", *extra, *resume)
    return run


def progression_run(args: argparse.Namespace) -> Path:
    if args.progression_run:
        return args.progression_run
    data, run = args.work / "progression-data", args.work / "progression"
    if not (data / "meta.json").exists():
        sheepop("progression", "generate", "--out", str(data))
    if not (run / checkpoint.TRAINER_JSON).exists():
        budget = (["--steps", str(args.progression_steps)] if args.progression_steps
                  else ["--minutes", str(args.progression_minutes)])
        threads = ["--set", f"train.threads={args.threads}"] if args.threads else []
        sheepop("progression", "train", str(data), "--out", str(run), "--no-progress", *budget,
                *threads)
    return run


def save(fig: plt.Figure, path: Path) -> None:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    files.atomic_write_bytes(path, buf.getvalue())
    print(f"wrote {path}")


def read_metrics(run_dir: Path) -> list[dict]:
    text = (run_dir / "metrics.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def plot_loss(run_dir: Path, path: Path, title: str, log: bool = False) -> dict:
    """Training and validation loss against the step, with ln(n_vocab) for reference; `log`
    for a loss that falls by orders of magnitude (the progression task learns it exactly)."""
    metrics, cfg = read_metrics(run_dir), run_config(run_dir)
    train = [(r["step"], r["loss"]) for r in metrics if "loss" in r]
    val = [(r["step"], r["val_loss"]) for r in metrics if "val_loss" in r]
    fig, ax = plt.subplots(figsize=(6.4, 4))
    ax.plot(*zip(*train), lw=1, label="train (one batch)")
    if val:
        ax.plot(*zip(*val), "o-", ms=3, label="validation")
    ax.axhline(math.log(cfg.model.vocab_size), ls="--", c="gray", lw=1,
               label=f"ln {cfg.model.vocab_size} (uniform)")
    ax.set(xlabel="optimizer step", ylabel="cross-entropy (nats per token)", title=title)
    if log:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend()
    save(fig, path)
    return {"steps": train[-1][0], "train_loss": train[-1][1],
            "val_loss": val[-1][1] if val else None}


def plot_lr(cfg: Config, path: Path) -> None:
    t = cfg.train
    steps = np.arange(t.steps)
    fig, ax = plt.subplots(figsize=(6.4, 3))
    ax.plot(steps, [lr_for(int(s), t) for s in steps], lw=1.5)
    ax.set(xlabel="optimizer step", ylabel="learning rate",
           title=f"tiny preset: warmup {t.warmup_steps} steps to {t.lr:g}, "
                 f"cosine to {t.min_lr:g} at step {t.decay_steps or t.steps}")
    ax.grid(alpha=0.3)
    save(fig, path)


def plot_positional(path: Path, n: int = 128, d: int = 128) -> None:
    table = sinusoidal_table(n, d)
    fig, ax = plt.subplots(figsize=(6.4, 5))
    im = ax.imshow(table, cmap="RdBu", vmin=-1, vmax=1, aspect="auto", interpolation="nearest")
    ax.set(xlabel="column (pair i = column // 2: sin at 2i, cos at 2i+1)", ylabel="position",
           title=f"sinusoidal P, {n} positions x d = {d} (before the 1/sqrt(d) scale)")
    fig.colorbar(im, ax=ax)
    save(fig, path)


def load_model(run_dir: Path, threads: int):
    import torch

    from sheepop.inference.load import read_run
    from sheepop.model.gpt import GPT
    if threads:
        torch.set_num_threads(threads)
    cfg, tokenizer, weights = read_run(run_dir)
    model = GPT(cfg.model)
    model.load_numpy_weights(weights)
    return model.eval(), tokenizer


def show(token: str) -> str:
    return {" ": "␣", "\n": "⏎", "\t": "⇥"}.get(token, token)


def plot_attention(model, tokenizer, path: Path, sentence: str = SENTENCE) -> None:
    """Every head of the first and the last layer on one line of text."""
    import torch
    ids = tokenizer.encode(sentence)
    layers = sorted({0, model.cfg.n_layer - 1})
    from sheepop.model.hooks import hooked
    attentions = {}
    keep = lambda a, point: attentions.__setitem__(int(point.split(".")[1]), a)  # noqa: E731
    with torch.no_grad(), hooked(model, {f"blocks.{i}.attn.pattern": keep for i in layers}):
        model(torch.tensor([ids]))
    H = attentions[0].shape[1]
    labels = [show(tokenizer.decode([i])) for i in ids]
    fig, axes = plt.subplots(len(layers), H, figsize=(3.1 * H, 3.3 * len(layers)),
                             squeeze=False)
    for row, layer in enumerate(layers):
        for h in range(H):
            ax = axes[row][h]
            ax.imshow(attentions[layer][0, h].numpy(), cmap="viridis", vmin=0, vmax=1)
            ax.set_title(f"layer {layer}, head {h}", fontsize=9)
            ax.set_xticks(range(len(ids)), labels, fontsize=6)
            ax.set_yticks(range(len(ids)), labels, fontsize=6)
    fig.suptitle(f"attention weights on {sentence!r} (row: query, column: key)")
    fig.tight_layout(h_pad=2.5)
    save(fig, path)


def plot_next_token(model, tokenizer, path: Path, prompt: str = PROMPT, k: int = 10) -> None:
    """The k most likely next tokens at temperature 1 and 0.5."""
    import torch
    ids = tokenizer.encode(prompt)
    with torch.no_grad():
        logits, _ = model(torch.tensor([ids]), last_only=True)
    z = logits[0, -1].double().numpy()
    p1, p05 = probabilities(z, 1.0), probabilities(z, 0.5)
    top = np.argsort(-p1, kind="stable")[:k]
    x = np.arange(k)
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    ax.bar(x - 0.2, p1[top], 0.4, label="temperature 1")
    ax.bar(x + 0.2, p05[top], 0.4, label="temperature 0.5")
    ax.set_xticks(x, [show(tokenizer.decode([int(i)])) for i in top])
    ax.set(ylabel="probability", title=f"next token after {prompt!r}")
    ax.grid(alpha=0.3, axis="y")
    ax.legend()
    save(fig, path)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    facts = {}
    plot_positional(args.out / "positional_encoding.png")
    plot_lr(build_config("tiny"), args.out / "lr_schedule.png")
    tiny = tiny_run(args)
    facts["tiny"] = plot_loss(tiny, args.out / "loss_tiny.png",
                              "sheepop train --preset tiny (built-in corpus)")
    model, tokenizer = load_model(tiny, args.threads)
    plot_attention(model, tokenizer, args.out / "attention.png")
    plot_next_token(model, tokenizer, args.out / "next_token.png")
    if not args.no_progression:
        prog = progression_run(args)
        facts["progression"] = plot_loss(prog, args.out / "loss_progression.png",
                                         "sheepop progression train", log=True)
    print(json.dumps(facts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
