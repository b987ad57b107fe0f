"""What `sheepop progression generate` draws: the ranges of a progressions data set.

Its own module, without NumPy, so that the command line can show its defaults without loading
what generating needs (sheepop.progression.data)."""

from __future__ import annotations

from dataclasses import dataclass

from sheepop.errors import UserError


@dataclass(frozen=True)
class Spec:
    """What `generate` draws. Ranges are inclusive."""

    count: int = 10_000
    min_terms: int = 2
    max_terms: int = 100
    min_difference: int = 1
    max_difference: int = 500
    first_min: int = 0
    first_max: int = 9_999
    heldout: float = 0.1
    digits: int = 0  # 0: the smallest width that holds the largest term
    seed: int = 0
    ood_count: int = 500  # sequences in each out-of-distribution file
    ood_extra_terms: int = 50  # the length set has max_terms+1 .. max_terms+ood_extra_terms terms
    ood_more_digits: int = 2  # sets of D+1 .. D+ood_more_digits digits (ood_digits_6, _7)

    def validate(self) -> Spec:
        checks = [
            (self.count >= 2, "--count must be at least 2"),
            (2 <= self.min_terms <= self.max_terms, "terms: need 2 <= min_terms <= max_terms"),
            (1 <= self.min_difference <= self.max_difference,
             "differences: need 1 <= min_difference <= max_difference"),
            (0 <= self.first_min <= self.first_max, "first term: need 0 <= first_min <= first_max"),
            (0.0 < self.heldout < 1.0, "heldout must be a fraction in (0, 1)"),
            (self.digits >= 0, "--digits must be positive (or 0 for automatic)"),
            (self.ood_count >= 0 and self.ood_extra_terms >= 1 and self.ood_more_digits >= 0,
             "ood_count and ood_more_digits must be >= 0 and ood_extra_terms >= 1"),
        ]
        for ok, message in checks:
            if not ok:
                raise UserError(message)
        pairs = (self.first_max - self.first_min + 1) * (self.max_difference
                                                         - self.min_difference + 1)
        if pairs < self.count + self.ood_count:
            raise UserError(f"only {pairs:,} distinct (first term, difference) pairs exist for "
                            f"{self.count + self.ood_count:,} sequences: widen the ranges")
        return self
