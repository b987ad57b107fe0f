"""Where next-term predictions fail: errors by the hundreds digit of the difference, by which
digit is wrong, and by the carries the addition needs.

The next term is t_(k+1) = t_k + d, a D-digit addition. Column i (0 = units) of it is

    s_i = a_i + d_i + c_i,   out_i = s_i mod 10,   c_(i+1) = [s_i >= 10],   c_0 = 0

(a = t_k, d the difference, digits least significant first). The *carry chain* of a prefix is
the longest run of consecutive columns that each carry into the next (0: no carry at all;
99 + 1 = 100 has a chain of 2). A model that learned the column rule once, whatever the column,
gets every chain right; one that learned which columns carry in the training data fails where
the data never carried.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sheepop.progression.evaluate import Prefixes
from sheepop.progression.scores import HEADLINE_MIN_K


def column_digits(values: np.ndarray, digits: int) -> np.ndarray:
    """(N, D) digits of non-negative integers, least significant first (column i = 10^i)."""
    return (np.asarray(values, dtype=np.int64)[:, None] // 10 ** np.arange(digits)) % 10


def carries(previous: np.ndarray, difference: np.ndarray, digits: int) -> np.ndarray:
    """(N, D) bool: c_(i+1), whether column i of previous + difference carries into i+1."""
    a, d = column_digits(previous, digits), column_digits(np.abs(difference), digits)
    out = np.zeros(a.shape, dtype=bool)
    c = np.zeros(len(a), dtype=np.int64)
    for i in range(digits):
        c = (a[:, i] + d[:, i] + c >= 10).astype(np.int64)
        out[:, i] = c == 1
    return out


def longest_run(flags: np.ndarray) -> np.ndarray:
    """(N,) the longest run of consecutive True along each row of (N, D) flags."""
    run = np.zeros(len(flags), dtype=np.int64)
    best = np.zeros(len(flags), dtype=np.int64)
    for i in range(flags.shape[1]):
        run = np.where(flags[:, i], run + 1, 0)
        best = np.maximum(best, run)
    return best


def _rows(mask: np.ndarray, keys: np.ndarray, exact: np.ndarray, wrong: np.ndarray
          ) -> dict[str, Any]:
    """For each value of `keys` over `mask`: the prefixes, their exact-match accuracy and the
    error rate of each digit position (most significant first)."""
    out = {}
    for key in np.unique(keys[mask]):
        m = mask & (keys == key)
        out[str(int(key))] = {"n": int(m.sum()), "next_term_accuracy": float(exact[m].mean()),
                              "digit_error_by_position": [float(v) for v in
                                                          wrong[m].mean(axis=0)]}
    return out


def error_tables(pre: Prefixes, predicted: np.ndarray, truth: np.ndarray) -> dict[str, Any]:
    """The failure analysis of one set (prefixes with k >= 2), from predicted and true digit
    ids (N, D), most significant first:

    by_hundreds    by the hundreds digit of the difference (d // 100 mod 10)
    by_carry_chain by the longest carry chain of t_k + d (`carries`, `longest_run`)
    by_wrong_digits  how many of the D digits are wrong, over the wrong predictions
    first_wrong_position  the most significant wrong digit (1 = the leading one), over the
                          wrong predictions"""
    predicted, truth = np.asarray(predicted), np.asarray(truth)
    digits = truth.shape[1]
    head = pre.k >= HEADLINE_MIN_K
    wrong = predicted != truth
    exact = ~wrong.any(axis=1)
    previous = pre.target - pre.difference
    chain = longest_run(carries(previous, pre.difference, digits))
    hundreds = (np.abs(pre.difference) // 100) % 10
    failed = head & ~exact
    n_wrong = wrong.sum(axis=1)
    first = np.argmax(wrong, axis=1) + 1
    return {
        "by_hundreds": _rows(head, hundreds, exact, wrong),
        "by_carry_chain": _rows(head, chain, exact, wrong),
        "by_wrong_digits": {str(v): int((failed & (n_wrong == v)).sum())
                            for v in range(1, digits + 1)},
        "first_wrong_position": {str(v): int((failed & (first == v)).sum())
                                 for v in range(1, digits + 1)},
    }


def _pct(v: float) -> str:
    return f"{100 * v:6.2f}%"


def analysis_table(name: str, tables: dict[str, Any]) -> str:
    """The terminal view of `error_tables`: accuracy and per-digit errors by hundreds digit
    and by carry chain, then which digits the wrong predictions got wrong."""
    lines = []
    for key, title in (("by_hundreds", "hundreds digit of the difference"),
                       ("by_carry_chain", "longest carry chain of t_k + d")):
        lines += ["", f"{name}, by {title}",
                  f"  {'value':<7}{'n':>8}{'next term':>11}   digit errors (most significant "
                  "first)"]
        for value, row in tables[key].items():
            errors = " ".join(_pct(v) for v in row["digit_error_by_position"])
            lines.append(f"  {value:<7}{row['n']:>8,}{_pct(row['next_term_accuracy']):>11}   "
                         f"{errors}")
    wrong = sum(tables["by_wrong_digits"].values())
    if wrong:
        spread = ", ".join(f"{k}: {v:,}" for k, v in tables["by_wrong_digits"].items() if v)
        first = ", ".join(f"{k}: {v:,}" for k, v in tables["first_wrong_position"].items() if v)
        lines += [f"  {wrong:,} wrong; digits wrong per wrong term {spread}",
                  f"  most significant wrong digit (1 = leading) {first}"]
    return "\n".join(lines)
