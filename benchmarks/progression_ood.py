"""Out-of-distribution progressions: compare evaluated runs set by set, and draw the pictures.

    sheepop progression eval RUN_A --data DATA      # writes RUN_A/progression_eval.json
    sheepop progression eval RUN_B --data DATA
    python benchmarks/progression_ood.py RUN_A RUN_B --names before,after \
        --images docs/images

Prints, for each run, next-term accuracy on every set (the held-out one and each ood_* file),
then the failure analysis of the first run on `ood_difference` (sheepop.progression.analysis):
accuracy and per-digit errors by the hundreds digit of the difference and by the longest carry
chain. With --images it draws

- progression_ood_accuracy.png    next-term accuracy against the difference (1-5000, buckets of
                                  the report), one line per run: training covers 1-500;
- progression_digit_errors.png    the per-digit error map: error rate of each digit position
                                  (columns, most significant first) by the hundreds digit of the
                                  difference (rows; 0-4 from the held-out set, 5-9 from
                                  ood_difference), one panel per run.

Nothing is trained here: training runs take minutes and are run by hand (docs/progression.md).
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

import numpy as np

from sheepop.files import atomic_write_bytes
from sheepop.progression.analysis import analysis_table
from sheepop.progression.report import set_title


def load_report(run: str) -> dict:
    path = Path(run)
    path = path / "progression_eval.json" if path.is_dir() else path
    if not path.is_file():
        sys.exit(f"{path}: no progression_eval.json (run `sheepop progression eval` first)")
    return json.loads(path.read_text())


def pct(v: float | None) -> str:
    return "      -" if v is None else f"{100 * v:7.2f}%"


def comparison(reports: dict[str, dict]) -> str:
    names = list(reports)
    sets = list(next(iter(reports.values()))["sets"])
    lines = [f"{'set':<30}{'prefixes':>9}" + "".join(f"{n:>12}" for n in names)]
    for s in sets:
        first = next(iter(reports.values()))["sets"][s]
        row = f"{set_title(s):<30}{first.get('prefixes', first.get('n_prefixes', 0)):>9,}"
        for n in names:
            row += f"{pct(reports[n]['sets'].get(s, {}).get('next_term_accuracy')):>12}"
        lines.append(row)
    return "\n".join(lines)


def merged_hundreds(report: dict) -> dict[int, tuple[int, np.ndarray]]:
    """Hundreds digit of the difference -> (prefixes, per-digit error rates), over the held-out
    set (differences 1-500) and ood_difference (501-1000), weighted by their prefixes."""
    out: dict[int, tuple[int, np.ndarray]] = {}
    for name in ("heldout", "ood_difference"):
        for key, row in report["sets"][name]["analysis"]["by_hundreds"].items():
            n, err = out.get(int(key), (0, 0.0))
            out[int(key)] = (n + row["n"], err + row["n"] * np.asarray(
                row["digit_error_by_position"]))
    return {k: (n, err / n) for k, (n, err) in sorted(out.items())}


def save(fig, path: Path) -> None:
    import matplotlib.pyplot as plt
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    print(f"wrote {path}")


def draw(reports: dict[str, dict], out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 3.6))
    for name, report in reports.items():
        xs, ys = [], []
        for s in ("heldout", "ood_difference", "ood_difference_large"):
            for bucket, row in report["sets"][s]["by_difference"].items():
                lo, hi = (int(v) for v in bucket.split("-"))
                xs.append((lo + hi) / 2)
                ys.append(100 * row["next_term_accuracy"])
        order = np.argsort(xs)
        ax.plot(np.asarray(xs)[order], np.asarray(ys)[order], marker="o", ms=3, lw=1.3,
                label=name)
    ax.axvspan(0, 500, color="0.9", zorder=0, label="training differences")
    ax.set(xscale="log", xlabel="difference d (bucket centre, log scale)",
           ylabel="next term exact (%)", ylim=(-3, 103),
           title="Next-term accuracy by the difference of the progression")
    ax.grid(alpha=0.3)
    ax.legend(frameon=False, loc="lower left")
    save(fig, out / "progression_ood_accuracy.png")

    fig, axes = plt.subplots(1, len(reports), figsize=(4.2 * len(reports), 3.8),
                             squeeze=False)
    for ax, (name, report) in zip(axes[0], reports.items()):
        rows = merged_hundreds(report)
        grid = 100 * np.stack([err for _, err in rows.values()])
        image = ax.imshow(grid, cmap="Reds", vmin=0, vmax=100, aspect="auto")
        D = grid.shape[1]
        ax.set_xticks(range(D), [f"10^{D - 1 - j}" for j in range(D)])
        ax.set_yticks(range(len(rows)), [str(k) for k in rows])
        ax.set(xlabel="digit of the next term", ylabel="hundreds digit of d", title=name)
        for i in range(grid.shape[0]):
            for j in range(D):
                ax.text(j, i, f"{grid[i, j]:.0f}", ha="center", va="center", fontsize=7,
                        color="white" if grid[i, j] > 50 else "black")
    fig.colorbar(image, ax=axes[0].tolist(), label="digit error (%)", shrink=0.8)
    fig.suptitle("Per-digit error by the hundreds digit of the difference "
                 "(d <= 500 held out, 501-1000 out of distribution)", fontsize=9)
    save(fig, out / "progression_digit_errors.png")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="run directories (or progression_eval.json files)")
    p.add_argument("--names", help="comma-separated names of the runs (default: their paths)")
    p.add_argument("--images", type=Path, help="draw the pictures into this directory")
    p.add_argument("--json", action="store_true", help="end with the comparison as JSON")
    args = p.parse_args()
    names = args.names.split(",") if args.names else args.runs
    if len(names) != len(args.runs):
        sys.exit("--names needs one name per run")
    reports = {n: load_report(r) for n, r in zip(names, args.runs)}
    print(comparison(reports))
    first = names[0]
    print(f"\nfailure analysis of {first!r}:")
    for s in ("heldout", "ood_difference"):
        print(analysis_table(f"{first}: {set_title(s)}", reports[first]["sets"][s]["analysis"]))
    if args.images:
        args.images.mkdir(parents=True, exist_ok=True)
        draw(reports, args.images)
    if args.json:
        print(json.dumps({n: {s: v.get("next_term_accuracy") for s, v in r["sets"].items()}
                          for n, r in reports.items()}))


if __name__ == "__main__":
    main()
