"""The held-out sets beyond the training ranges of the progression task: how each is drawn.

Each set is drawn after the in-distribution sequences from the same seeded generator, in a
fixed order, so adding a set never changes the files before it, and every (first term,
difference) pair is distinct from all others drawn (sheepop.progression.data).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from sheepop.errors import UserError


@dataclass(frozen=True)
class OodSet:
    """How one out-of-distribution set is drawn: ranges (inclusive) of its first terms,
    differences and numbers of terms, its width, and what happens to a draw that would not fit
    in that width: `redraw` draws again (the long set: its length is the point), otherwise the
    sequence is shortened to the terms that fit (at least 3, else drawn again)."""

    first: tuple[int, int]
    difference: tuple[int, int]
    terms: tuple[int, int]
    digits: int
    redraw: bool = False


def ood_sets(spec: Any, digits: int) -> dict[str, OodSet]:
    """The held-out sets beyond the training ranges of `spec` (a sheepop.progression.data.Spec),
    in the order they are drawn (after the in-distribution sequences, so adding a set never
    changes the ones before it):

    ood_difference         differences max+1 .. 2 max              (501-1000)
    ood_length             max_terms+1 .. max_terms+extra terms    (101-150)
    ood_difference_large   differences 2 max+1 .. 10 max           (1001-5000)
    ood_first_term         first terms first_max+1 .. first_max + 4 (first range) (10000-49999)
    ood_digits_{D+j}       j = 1 .. ood_more_digits: D+j-digit numbers (first term at least
                           10^(D+j-1)), differences and terms as in training."""
    n = (max(3, spec.min_terms), max(3, spec.max_terms))
    first, diff = (spec.first_min, spec.first_max), (spec.min_difference, spec.max_difference)
    width = spec.first_max - spec.first_min + 1
    sets = {"ood_difference": OodSet(first, (diff[1] + 1, 2 * diff[1]), n, digits),
            "ood_length": OodSet(first, diff, (spec.max_terms + 1,
                                               spec.max_terms + spec.ood_extra_terms),
                                 digits, redraw=True),
            "ood_difference_large": OodSet(first, (2 * diff[1] + 1, 10 * diff[1]), n, digits),
            "ood_first_term": OodSet((spec.first_max + 1, spec.first_max + 4 * width), diff, n,
                                     digits)}
    for more in range(1, spec.ood_more_digits + 1):
        wide = digits + more
        sets[f"ood_digits_{wide}"] = OodSet((10 ** (wide - 1), 10 ** wide - 1), diff, n, wide)
    return sets


def draw_set(rng: np.random.Generator, pairs: Any, how: OodSet, count: int
             ) -> tuple[list[np.ndarray], int]:
    """`count` sequences drawn as `how` says, all of whose terms fit in its digits, and how
    many draws did not fit. `pairs.draw(first, difference)` gives (a, d) pairs distinct from
    every other drawn (sheepop.progression.data)."""
    out, misfits, limit = [], 0, 10 ** how.digits - 1
    while len(out) < count:
        if misfits > 100 * count + 1000:
            raise UserError(f"{limit + 1:,} is too small a bound for the out-of-distribution "
                            "sequences: give more --digits")
        n = int(rng.integers(how.terms[0], how.terms[1] + 1))
        a, d = pairs.draw(how.first, how.difference)
        n_fit = (limit - a) // d + 1
        if n > n_fit:
            misfits += 1
            if how.redraw or n_fit < 3:
                continue
            n = n_fit
        out.append(a + d * np.arange(n, dtype=np.int64))
    return out, int(misfits)
