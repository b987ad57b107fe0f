"""Evaluating a run on every set of a data directory, and showing it: a table and a plot.

Sets: `heldout` (in distribution: the held-out lines of dataset.txt) and every `ood_*` file of
the data directory (sheepop.progression.ood), each under its file's stem in `sets` with its
`next_term_accuracy`, the `prefixes` scored, its `digits`, the `context_terms` given and the
failure analysis (sheepop.progression.analysis). A set whose numbers are too wide for the
model's block is listed with `skipped`. The top-level `next_term_accuracy` is the held-out
one.
"""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import Any

import numpy as np

from sheepop.files import atomic_write_bytes
from sheepop.inference.load import InferenceModel
from sheepop.progression.analysis import analysis_table, error_tables
from sheepop.progression.data import Progressions
from sheepop.progression.evaluate import context_terms, predict_next_terms, seen_in_training
from sheepop.progression.scores import score
from sheepop.progression.stream import term_digits
from sheepop.progression.task import TaskOptions

SET_TITLES = {"heldout": "held-out (in distribution)",
              "ood_difference": "OOD: differences x2",
              "ood_difference_large": "OOD: differences x2-x10",
              "ood_first_term": "OOD: larger first terms",
              "ood_length": "OOD: more terms"}


def set_title(name: str) -> str:
    if name.startswith("ood_digits_"):
        return f"OOD: {name.rsplit('_', 1)[1]}-digit numbers"
    return SET_TITLES.get(name, name)


def evaluate_sets(model: InferenceModel, data: Progressions, opts: TaskOptions,
                  max_sequences: int = 0, batch_size: int = 2048) -> dict[str, Any]:
    """Score every set; `max_sequences` > 0 keeps only the first that many of each."""
    if data.digits != opts.digits:
        from sheepop.errors import UserError
        raise UserError(f"the run was trained on {opts.digits}-digit terms, the data has "
                        f"{data.digits}-digit terms")
    sets = {"heldout": data.heldout, **data.ood}
    largest_seen = max(int(s.max()) for s in data.train)
    report: dict[str, Any] = {"sets": {}}
    t0 = time.perf_counter()
    for name, sequences in sets.items():
        if max_sequences:
            sequences = sequences[:max_sequences]
        digits = data.digits_of(name)
        given = context_terms(opts, digits)
        if not given:
            report["sets"][name] = {"digits": digits, "context_terms": 0, "prefixes": 0,
                                    "next_term_accuracy": None,
                                    "skipped": f"two {digits}-digit terms and the answer do not "
                                               f"fit the block of {opts.block_size} positions"}
            continue
        pre, written = predict_next_terms(model.lm, sequences, opts, batch_size, digits)
        seen = seen_in_training(data.train, sequences, opts, given)
        truth = term_digits(pre.target, digits)
        result = score(pre, written, truth, largest_seen, seen)
        report["sets"][name] = {"digits": digits, "context_terms": given,
                                "prefixes": result["n_prefixes"], **result,
                                "analysis": error_tables(pre, written, truth)}
    report["seconds"] = round(time.perf_counter() - t0, 2)
    held = report["sets"]["heldout"]
    for key in ("next_term_accuracy", "digit_accuracy", "continuation_accuracy"):
        report[key] = held[key]
    report["engine"] = model.engine
    report["largest_training_term"] = largest_seen
    return report


def _pct(v: float | None) -> str:
    return "    -" if v is None else f"{100 * v:6.2f}%"


def table(report: dict[str, Any]) -> str:
    """The terminal view: one summary row per set, then each set by k and by difference."""
    lines = [f"{'set':<28}{'D':>3}{'given':>6}{'prefixes':>9}{'next term':>11}{'per digit':>11}"
             f"{'rest of seq':>13}{'k=1':>9}"]
    for name, s in report["sets"].items():
        if "skipped" in s:
            lines.append(f"{set_title(name):<28}{s['digits']:>3}{0:>6}   not run: {s['skipped']}")
            continue
        lines.append(f"{set_title(name):<28}{s['digits']:>3}{s['context_terms']:>6}"
                     f"{s['n_prefixes']:>9,}"
                     f"{_pct(s['next_term_accuracy']):>11}{_pct(s['digit_accuracy']):>11}"
                     f"{_pct(s['continuation_accuracy']):>13}"
                     f"{_pct(s['k1_next_term_accuracy']):>9}")
    lines.append("(D = digits per term, given = context terms at most; k = terms given; the "
                 "figures count k >= 2, k = 1 cannot know the difference; 'rest of seq' = the "
                 "whole continuation from k right)")
    for name, s in report["sets"].items():
        if "skipped" in s:
            continue
        for key, title in (("by_k", "k"), ("by_difference", "difference"),
                           ("by_value", "term to predict"), ("by_window", "window")):
            if key not in s:
                continue
            lines.append("")
            lines.append(f"{set_title(name)}, by {title}")
            lines.append(f"  {title:<16}{'n':>8}{'next term':>11}{'per digit':>11}"
                         f"{'rest of seq':>13}")
            for bucket, row in s[key].items():
                lines.append(f"  {bucket:<16}{row['n']:>8,}{_pct(row['next_term_accuracy']):>11}"
                             f"{_pct(row['digit_accuracy']):>11}"
                             f"{_pct(row['continuation_accuracy']):>13}")
        by_pos = " ".join(f"{100 * v:.2f}" for v in s["digit_accuracy_by_position"])
        lines.append(f"  per-digit accuracy by position (most significant first): {by_pos}")
        if "analysis" in s:
            lines.append(analysis_table(set_title(name), s["analysis"]))
    lines.append("")
    lines.append(f"evaluated in {report['seconds']:.1f} s with the {report['engine']} engine")
    return "\n".join(lines)


def plot(report: dict[str, Any], path: str | Path, title: str = "") -> None:
    """progression.png: next-term and whole-continuation accuracy against k, one line a set."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for name, s in report["sets"].items():
        if "skipped" in s:
            continue
        curve = s["curve"]
        k = np.asarray(curve["k"])
        for ax, key in zip(axes, ("next_term_accuracy", "continuation_accuracy")):
            ax.plot(k, 100 * np.asarray(curve[key]), lw=1.2, label=set_title(name))
    axes[0].set(xlabel="k (terms given)", ylabel="exact match (%)",
                title="next term, greedy")
    axes[1].set(xlabel="k (terms given)", title="the whole rest of the sequence")
    for ax in axes:
        ax.set_ylim(-2, 102)
        ax.grid(alpha=0.3)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=3,
               bbox_to_anchor=(0.5, -0.1), frameon=False)
    if title:
        fig.suptitle(title, y=1.02)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
