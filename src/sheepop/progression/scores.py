"""Scoring predicted next terms: exact match, per-digit accuracy, whole continuations.

For prefix i (sequence s_i, k_i terms given) with predicted digits p_i and true digits t_i (D
each, most significant first):

    exact_i      = [p_i == t_i]                       (all D digits right)
    digits_i     = sum_j [p_ij == t_ij]               (per-digit accuracy = sum digits_i / (D N))
    continues_i  = AND over prefixes j of s_i with k_j >= k_i of exact_j

`continues_i` is whether greedy generation from the first k_i terms writes the whole rest of the
sequence right (see `evaluate.py` for why it equals the AND). The headline figures count k >= 2:
with one term given the difference is unknown, so k = 1 is reported on its own.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sheepop.progression.evaluate import Prefixes

K_BUCKETS = [(1, 1), (2, 2), (3, 3), (4, 4), (5, 9), (10, 19), (20, 49), (50, 99), (100, 124),
             (125, 149), (150, 10**9)]
DIFFERENCE_BUCKET = 100
HEADLINE_MIN_K = 2


def continuation(seq: np.ndarray, k: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """continues_i: every prediction of the same sequence at k >= k_i is exact."""
    order = np.lexsort((-k, seq))  # each sequence's prefixes from its largest k down
    wrong = (~exact[order]).astype(np.int64)
    seq_sorted = seq[order]
    first = np.r_[True, seq_sorted[1:] != seq_sorted[:-1]]
    total = np.cumsum(wrong)
    before_group = (total - wrong)[first]  # wrong ones counted before each group starts
    group = np.cumsum(first) - 1
    wrong_from_here = total - before_group[group]  # wrong at k' >= k within the sequence
    out = np.empty(len(seq), dtype=bool)
    out[order] = wrong_from_here == 0
    return out


def _summary(mask: np.ndarray, exact: np.ndarray, digit_hits: np.ndarray, continues: np.ndarray,
             digits: int) -> dict[str, Any]:
    n = int(mask.sum())
    if n == 0:
        return {"n": 0, "next_term_accuracy": None, "digit_accuracy": None,
                "continuation_accuracy": None}
    return {"n": n, "next_term_accuracy": float(exact[mask].mean()),
            "digit_accuracy": float(digit_hits[mask].sum() / (digits * n)),
            "continuation_accuracy": float(continues[mask].mean())}


def score(pre: Prefixes, predicted: np.ndarray, truth: np.ndarray,
          largest_seen: int | None = None, window_seen: np.ndarray | None = None
          ) -> dict[str, Any]:
    """All the figures of one set, from predicted and true digit ids (N, D). With
    `largest_seen` (the largest term of the training data) the headline prefixes are also
    split by whether the term to predict is within the values seen in training; with
    `window_seen` (N,) by whether the context and answer occur verbatim in training."""
    predicted, truth = np.asarray(predicted), np.asarray(truth)
    digits = truth.shape[1]
    hits = predicted == truth
    exact = hits.all(axis=1)
    digit_hits = hits.sum(axis=1)
    continues = continuation(pre.seq, pre.k, exact)
    headline = pre.k >= HEADLINE_MIN_K
    out: dict[str, Any] = {
        "n_sequences": int(len(np.unique(pre.seq))),
        "n_prefixes": int(headline.sum()),
        **{key: value for key, value in _summary(headline, exact, digit_hits, continues,
                                                 digits).items() if key != "n"},
        "digit_accuracy_by_position": [float(v) for v in hits[headline].mean(axis=0)]
        if headline.any() else [],
        "k1_next_term_accuracy": _summary(pre.k == 1, exact, digit_hits, continues,
                                          digits)["next_term_accuracy"],
    }
    if largest_seen is not None:
        beyond = pre.target > largest_seen
        out["by_value"] = {
            f"<= {largest_seen}": _summary(headline & ~beyond, exact, digit_hits, continues,
                                           digits),
            f"> {largest_seen}": _summary(headline & beyond, exact, digit_hits, continues,
                                          digits)}
    if window_seen is not None:
        out["by_window"] = {
            "in training": _summary(headline & window_seen, exact, digit_hits, continues, digits),
            "never seen": _summary(headline & ~window_seen, exact, digit_hits, continues,
                                   digits)}
    out["by_k"] = {}
    for lo, hi in K_BUCKETS:
        mask = (pre.k >= lo) & (pre.k <= hi)
        if mask.any():
            name = str(lo) if lo == hi else (f"{lo}+" if hi >= 10**9 else f"{lo}-{hi}")
            out["by_k"][name] = _summary(mask, exact, digit_hits, continues, digits)
    out["by_difference"] = {}
    # buckets of 100, or of 500 past a difference of 1000 (fewer rows for the large set)
    width = DIFFERENCE_BUCKET * (5 if np.abs(pre.difference).max(initial=0) > 1000 else 1)
    bucket = (np.abs(pre.difference) - 1) // width
    for b in np.unique(bucket[headline]):
        mask = headline & (bucket == b)
        name = f"{b * width + 1}-{(b + 1) * width}"
        out["by_difference"][name] = _summary(mask, exact, digit_hits, continues, digits)
    ks = np.unique(pre.k)
    out["curve"] = {"k": ks.tolist(),
                    "next_term_accuracy": [float(exact[pre.k == v].mean()) for v in ks],
                    "continuation_accuracy": [float(continues[pre.k == v].mean()) for v in ks]}
    return out
