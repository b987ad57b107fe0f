"""A bound on the digits of a JSON number: at most 15 in its integer part and fraction together,
at most 3 in its exponent.

A JSON schema's `number` is a regular expression with no end to its digits (llguidance's
`-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?`; `{"maximum": 1}` still admits `1.000...`),
and llguidance has no option to bound them (its JSON options are separators, whitespace,
oneOf and escapes). A sampled answer can then spend its whole budget inside one number:
SmolLM2 at temperature 1 wrote `"scores": [1, 1.0000000...` until `max_tokens` in 9 of 200
samples (docs/serve.md, "Structured output"). So the grammar's mask A_t (the tokens that keep
the text a prefix of a valid one) is narrowed by one more rule:

    B_t = { i in A_t : after token i every number so far is within the bound, and a number
                       that token i takes to the bound can go on without another digit }
    mask_t = B_t   if B_t is not empty,   else A_t

The second condition is a look one token ahead (`ConstraintState` asks llguidance's matcher:
consume i, is any token other than a further digit allowed, roll back), needed only for the
tokens that reach the bound exactly: above an `exclusiveMinimum` of 0.5, `0.50000000000000`
can only go on with a digit, so its last `0` is refused and `1`..`9` are kept. Since B_t is a
subset of A_t every text still satisfies the grammar, and an end token is in B_t exactly when
it is in A_t (it writes no digit): a sample that ends is as valid as before. Where the schema
needs more digits than the bound (an integer `minimum` of 10**20) B_t is empty and the
grammar's own mask stands, so the bound never leaves a sample without a next token.

Why 15: a float64 holds any decimal of at most 15 significant digits exactly enough to give it
back (DBL_DIG), so two such decimals never become the same float64; `jsonschema` compares the
float64 that `json.loads` reads while llguidance compares decimals, and within the bound they
agree (beyond it they need not: `0.50000000000000001` is above an exclusive minimum of 0.5 as a
decimal and equal to it as a float64, and was in the grammar's language). The digits counted
are those of the integer part and the fraction, except a lone integer part `0` (`0.25` counts
2, `12.5` counts 3, `0.001` counts 3: zeros after the point are counted, or `0.000...` could
run on). What falls outside is a choice: an integer of more than 15 digits, a fraction that
needs more (`1e-20` may still be written `1e-20` where the schema admits an exponent; a
bounded range's regular expressions have none). Digits inside strings are text and never
counted (`"zip": "12345"`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

MAX_DIGITS = 15
MAX_EXPONENT_DIGITS = 3  # (float64's exponents run to 308)

# Where the text is, between two tokens, and which part of a number it is in.
OUTSIDE, IN_STRING, ESCAPED = 0, 1, 2
NONE, ZERO, MANTISSA, EXPONENT = 0, 1, 2, 3
_NUMERIC = re.compile(rb"[0-9.]")


class Place(NamedTuple):
    """Where the text is (OUTSIDE, IN_STRING, ESCAPED), the part of a number it ends in (NONE,
    ZERO: the integer part `0` so far, MANTISSA, EXPONENT) and the digits counted there."""
    where: int = OUTSIDE
    part: int = NONE
    count: int = 0


def read(data: bytes, place: Place) -> tuple[Place, bool]:
    """The place after `data`, and whether every number in it stays within the bound (a `.`
    counts the fraction digit that must follow it)."""
    where, part, count = place
    ok = True
    for b in data:
        if where == ESCAPED:
            where = IN_STRING
        elif where == IN_STRING:
            where = OUTSIDE if b == 0x22 else ESCAPED if b == 0x5C else IN_STRING
        elif 0x30 <= b <= 0x39:
            if part == NONE:
                part, count = (ZERO if b == 0x30 else MANTISSA), 1
            else:
                part, count = (EXPONENT if part == EXPONENT else MANTISSA), count + 1
            ok &= count <= (MAX_EXPONENT_DIGITS if part == EXPONENT else MAX_DIGITS)
        elif b == 0x2E and part in (ZERO, MANTISSA):  # '.': a lone 0 before it is not counted
            ok &= part == ZERO or count < MAX_DIGITS
            part, count = MANTISSA, (0 if part == ZERO else count)
        elif b in (0x65, 0x45) and part in (ZERO, MANTISSA):  # 'e', 'E'
            part, count = EXPONENT, 0
        elif b in (0x2B, 0x2D) and (part == EXPONENT or (b == 0x2D and part == NONE)):
            pass  # an exponent's sign, or a number's minus
        else:
            where, part, count = (IN_STRING if b == 0x22 else OUTSIDE), NONE, 0
    return Place(where, part, count), ok


def at_bound(place: Place) -> bool:
    """Whether a number's part ends here with all the digits the bound allows it."""
    return (place.part == MANTISSA and place.count == MAX_DIGITS) or \
        (place.part == EXPONENT and place.count == MAX_EXPONENT_DIGITS)


class DigitTable:
    """For each place met so far, which tokens would break the bound from it (`over`) and
    which would take a number to it exactly (`edge`: those the look ahead checks); built
    once per vocabulary, one place at a time as sequences reach it. Only the tokens with a
    digit or a point are read (a few hundred of SmolLM2's 49,152 ids)."""

    def __init__(self, tokens: Sequence[bytes | None]):
        self.tokens = tokens
        self.numeric = [i for i, t in enumerate(tokens) if t is not None and _NUMERIC.search(t)]
        self._rows: dict[Place, tuple[np.ndarray, np.ndarray]] = {}

    def row(self, place: Place) -> tuple[np.ndarray, np.ndarray]:
        """(over, edge): bool arrays over the vocabulary, for tokens read from `place`."""
        found = self._rows.get(place)
        if found is None:
            over = np.zeros(len(self.tokens), dtype=bool)
            edge = np.zeros(len(self.tokens), dtype=bool)
            for i in self.numeric:
                after, ok = read(self.tokens[i], place)
                over[i], edge[i] = not ok, ok and at_bound(after)
            found = self._rows[place] = (over, edge)
        return found

    def after(self, place: Place, token: int) -> Place:
        """The place after `token` (a special token, or an id past the vocabulary, writes
        nothing)."""
        data = self.tokens[token] if token < len(self.tokens) else None
        return read(data, place)[0] if data else place
