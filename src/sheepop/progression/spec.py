"""What `sheepop progression generate` draws: the ranges of a progressions data set.

Its own module, without NumPy, so that the command line can show its defaults without loading
what generating needs (sheepop.progression.data)."""

from __future__ import annotations

from dataclasses import dataclass

from sheepop.errors import UserError

# Terms are int64 (sheepop.progression.data): every number of MAX_WIDTH digits is below 2**63,
# and not every one of MAX_WIDTH + 1 (10**19 > 2**63 - 1).
MAX_WIDTH = len(str(2**63 - 1)) - 1


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
        self._check_width()
        pairs = (self.first_max - self.first_min + 1) * (self.max_difference
                                                         - self.min_difference + 1)
        if pairs < self.count + self.ood_count:
            raise UserError(f"only {pairs:,} distinct (first term, difference) pairs exist for "
                            f"{self.count + self.ood_count:,} sequences: widen the ranges")
        return self

    def _check_width(self) -> None:
        """Every term stays below 2**63 (int64), the out-of-distribution sets' included: they
        write numbers of up to D + ood_more_digits digits (sheepop.progression.ood), D being
        --digits or the width of the largest in-distribution term, so D may have at most
        MAX_WIDTH - ood_more_digits digits. Said of the option that breaks it, before any
        draw (NumPy would say "high is out of bounds for int64", or wrap around silently)."""
        why = (f"as the out-of-distribution sets add up to --ood-more-digits "
               f"({self.ood_more_digits}) digits to the terms' width and every term must stay "
               f"below 2**63 (int64)")
        if self.ood_more_digits >= MAX_WIDTH:
            raise UserError(f"--ood-more-digits {self.ood_more_digits} is too large: at most "
                            f"{MAX_WIDTH - 1}, {why}")
        widest = MAX_WIDTH - self.ood_more_digits  # D's largest
        if self.digits > widest:
            raise UserError(f"--digits {self.digits} is too large: at most {widest}, {why}")
        largest = 10**widest - 1
        for option, value in (("--first-max", self.first_max),
                              ("--max-difference", self.max_difference)):
            if value > largest:
                raise UserError(f"{option} {value} is too large: at most {largest} ({widest} "
                                f"digits), {why}")
        last = self.first_max + self.max_difference * (self.max_terms - 1)
        if last > largest:
            raise UserError(f"the largest term, --first-max + --max-difference * (--max-terms "
                            f"- 1) = {last}, is too large: at most {largest} ({widest} "
                            f"digits), {why}")
