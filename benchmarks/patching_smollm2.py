"""Activation patching, attribution patching and direct logit attribution on SmolLM2-135M-Instruct
(docs/experiments.md's worked example): which blocks and heads carry " Paris" in "The capital of
France is", and " Mary" in the indirect-object sentence.

    python benchmarks/patching_smollm2.py                      # imports SmolLM2; both examples
    python benchmarks/patching_smollm2.py --run /tmp/smol --example france
    python benchmarks/patching_smollm2.py --run /tmp/smol --example ioi --exact-layers 20-29

For each example: the two metrics m = z[answer] - z[wrong]; the exact layers x positions grid
(block l's output at position t moved from the clean pass into the corrupted one, score
(m - m*) / (m_c - m*)) and its attribution estimate side by side, with their agreement (Pearson
r over the cells, the largest difference); the layers x heads grid's strongest heads, exact and
estimated; the direct logit attribution of m (each part's share of z[answer] minus its share of
z[wrong]) with its largest parts and the sum against m. `--exact-layers` limits the exact grids
(one forward pass a cell) to some blocks; the estimates always cover every block. Printed
per stage: the forward passes and the seconds. The numbers do not depend on the machine's load
(one thread); the seconds do.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "helpers"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import machine  # noqa: E402
from structured_output import smollm2_run  # noqa: E402

EXAMPLES = {
    "france": ("The capital of France is", "The capital of Italy is", " Paris", " Rome"),
    "ioi": ("When Mary and John went to the store, John gave a drink to",
            "When John and Mary went to the store, Mary gave a drink to", " Mary", " John"),
}


def layer_range(text: str | None, n_layer: int) -> list[int]:
    if text is None:
        return list(range(n_layer))
    first, _, last = text.partition("-")
    return list(range(int(first), int(last or first) + 1))


def agreement(exact: np.ndarray, estimate: np.ndarray) -> str:
    if exact.size < 2 or np.std(exact) == 0 or np.std(estimate) == 0:
        return "agreement: too few cells"
    r = float(np.corrcoef(exact.ravel(), estimate.ravel())[0, 1])
    return (f"agreement over {exact.size} cells: Pearson r = {r:.3f}, largest |exact - "
            f"estimate| = {np.abs(exact - estimate).max():.3f}")


def show_positions(exact, estimate, texts: list[str]) -> None:
    print("  block   " + " ".join(f"{t[:9]!r:>12}" for t in texts))
    rows = {layer: r for r, layer in enumerate(exact.layers)}
    for r, layer in enumerate(estimate.layers):
        cells = []
        for t in range(len(texts)):
            ex = f"{exact.scores[rows[layer], t]:5.2f}" if layer in rows else "    -"
            cells.append(f"{ex}/{estimate.scores[r, t]:5.2f}".rjust(12))
        print(f"  {layer:5d}   " + " ".join(cells))


def run_example(engine, tok, name: str, exact_layers: list[int], top: int) -> None:
    from sheepop.inference.attribution import attribution_grid
    from sheepop.inference.logit_attribution import logit_shares
    from sheepop.inference.patching import contrast, patch_grid
    clean_text, corrupted_text, answer, wrong = EXAMPLES[name]
    (a,), (w,) = tok.encode(answer), tok.encode(wrong)
    c = contrast(tok.encode(clean_text), tok.encode(corrupted_text), a, w, engine.cfg.vocab_size)
    texts = [tok.decode([i]) for i in c.clean]
    print(f"\n== {name}: clean {clean_text!r}, corrupted {corrupted_text!r} ({len(c.clean)} "
          f"tokens); m = z[{answer!r}] - z[{wrong!r}]")
    started = time.perf_counter()
    exact = patch_grid(engine, c, "positions", exact_layers)
    seconds = time.perf_counter() - started
    started = time.perf_counter()
    estimate = attribution_grid(engine, c, "positions")
    estimate_seconds = time.perf_counter() - started
    print(f"m_clean = {exact.clean:.4f}, m_corrupted = {exact.corrupted:.4f}")
    print(f"layers x positions (block l's output at t), exact/estimate; exact: "
          f"{exact.metric.size} passes in {seconds:.1f} s, estimate: 2 forward + 1 backward "
          f"in {estimate_seconds:.1f} s")
    show_positions(exact, estimate, texts)
    rows = [estimate.layers.index(layer) for layer in exact.layers]
    print("  " + agreement(exact.scores, estimate.scores[rows]))
    started = time.perf_counter()
    heads = patch_grid(engine, c, "heads", exact_layers)
    seconds = time.perf_counter() - started
    heads_estimate = attribution_grid(engine, c, "heads")
    H = engine.cfg.n_head
    print(f"layers x heads (each head's output at every position): exact {heads.metric.size} "
          f"passes in {seconds:.1f} s; the {top} strongest by |exact score|, block.head "
          "exact/estimate:")
    order = np.argsort(-np.abs(heads.scores), axis=None)[:top]
    rows = [heads_estimate.layers.index(layer) for layer in heads.layers]
    print("  " + "  ".join(f"{heads.layers[i // H]}.{i % H} {heads.scores.flat[i]:.2f}/"
                           f"{heads_estimate.scores[rows].flat[i]:.2f}" for i in order))
    print("  " + agreement(heads.scores, heads_estimate.scores[rows]))
    for prompt, ids in (("clean", c.clean), ("corrupted", c.corrupted)):
        up, down = logit_shares(engine, ids, a), logit_shares(engine, ids, w)
        shares = up.shares - down.shares
        order = np.argsort(-np.abs(shares))[:top]
        print(f"direct logit attribution of m on the {prompt} prompt: sum of {len(shares)} "
              f"shares {shares.sum():.4f} against m = {up.logit - down.logit:.4f}; largest:")
        print("  " + "  ".join(f"{up.names[i].replace('blocks.', 'b').replace('attn.head.', 'h')}"
                               f" {shares[i]:+.2f}" for i in order))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", type=Path, help="an imported SmolLM2 run (default: import it)")
    ap.add_argument("--example", choices=[*EXAMPLES, "all"], default="all")
    ap.add_argument("--engine", default="numpy", choices=["numpy", "torch"])
    ap.add_argument("--exact-layers", help="the blocks of the exact grids, 'first-last' "
                                            "(default: every block)")
    ap.add_argument("--top", type=int, default=8, help="heads and parts listed")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    from sheepop import threads
    print(f"threads: {threads.apply(args.threads)}")
    print(machine.summary())
    from sheepop.inference.hooked_engines import hooked_engine
    from sheepop.inference.load import load
    model = load(smollm2_run(args.run), engine=args.engine, device="cpu")
    engine = hooked_engine(model)
    layers = layer_range(args.exact_layers, model.config.model.n_layer)
    print(f"engine: {args.engine}; exact grids over blocks {layers[0]}..{layers[-1]}")
    for name in EXAMPLES if args.example == "all" else [args.example]:
        run_example(engine, model.tokenizer, name, layers, args.top)
    print(f"\nload average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
