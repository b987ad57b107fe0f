"""Token streams and term-aligned training windows for the progression task.

A sequence of n terms becomes n * (D + 1) tokens: each term's D digit ids, then the space id
(the digits tokenizer: '0'..'9' are ids 0..9, ' ' is id 10). With `reverse=True` each term's
digits are written least significant first, so that the carry of the next digit is always one
the model has already written.

A training window holds m consecutive terms of one sequence and starts on a term boundary:

    tokens  t_j t_j+1 ... t_j+m-1     (m (D+1) tokens, the last one a space)
    x = tokens[:-1],  y = tokens[1:]  (block_size = m (D+1) - 1)

Nothing in the window determines its first term, and the second one only fixes the difference,
so with `mask_given=2` the targets that lie inside those two terms (and the space after the
second) are IGNORE_INDEX: the loss falls on the terms that can be predicted, t_(i+1) = 2 t_i -
t_(i-1). A sequence shorter than m terms gives one padded window (x = space id, y = -1 past
its end). Window starts are drawn uniformly over every (sequence, first term) start, so each
predictable term is trained on about equally often.

The sampler's state is its RNG state only, the same `{"rng": ...}` dictionary the shared
`WindowSampler` uses in random mode, so a resumed run continues the exact same batches.
"""

from __future__ import annotations

import numpy as np

from sheepop.arch import IGNORE_INDEX
from sheepop.data.windows import RandomSampler
from sheepop.errors import UserError

SPACE_ID = 10


def term_digits(values: np.ndarray, digits: int, reverse: bool = False) -> np.ndarray:
    """Digit ids (..., D) of non-negative integers, most significant first unless `reverse`."""
    powers = 10 ** np.arange(digits - 1, -1, -1, dtype=np.int64)
    out = (np.asarray(values, dtype=np.int64)[..., None] // powers) % 10
    return out[..., ::-1] if reverse else out


def digits_value(ids: np.ndarray, reverse: bool = False) -> np.ndarray:
    """Inverse of `term_digits`: the integer of each row of D ids; -1 where an id is not a
    digit (e.g. the model wrote a space)."""
    ids = np.asarray(ids, dtype=np.int64)
    if reverse:
        ids = ids[..., ::-1]
    digits = ids.shape[-1]
    powers = 10 ** np.arange(digits - 1, -1, -1, dtype=np.int64)
    values = (np.clip(ids, 0, 9) * powers).sum(-1)
    return np.where((ids > 9).any(-1), -1, values)


def sequence_tokens(terms: np.ndarray, digits: int, reverse: bool = False) -> np.ndarray:
    """n (D+1) token ids: each term's digits followed by a space."""
    body = term_digits(terms, digits, reverse)
    spaced = np.concatenate([body, np.full((len(terms), 1), SPACE_ID, np.int64)], axis=1)
    return spaced.reshape(-1)


def flat_stream(sequences: list[np.ndarray], digits: int, reverse: bool = False) -> np.ndarray:
    """All sequences' tokens end to end (uint16), for the trainer's own bookkeeping."""
    parts = [sequence_tokens(s, digits, reverse) for s in sequences]
    return np.concatenate(parts).astype(np.uint16) if parts else np.zeros(0, np.uint16)


class TermWindows:
    """Term-aligned (x, y) windows of `terms` consecutive terms, drawn from `sequences`."""

    def __init__(self, sequences: list[np.ndarray], digits: int, terms: int,
                 reverse: bool = False, mask_given: int = 2, both_ways: bool = False):
        if terms < 3:
            raise UserError(f"a window needs at least 3 terms (2 given, 1 predicted), not {terms}")
        if not 0 <= mask_given < terms:
            raise UserError(f"mask_given must be in [0, {terms - 1}], not {mask_given}")
        # both_ways: each sequence also read last term first, a decreasing progression of the
        # same terms (difference -d): the same values and |d|, other digit pairs per column.
        if both_ways:
            sequences = [*sequences, *(s[::-1] for s in sequences)]
        usable = [s for s in sequences if len(s) > mask_given]
        if not usable:
            raise UserError("no sequence is long enough to have a term to predict")
        self.digits, self.terms, self.mask_given = digits, terms, mask_given
        self.length = terms * (digits + 1)  # tokens in a full window: x and y are length - 1
        stream = [sequence_tokens(s, digits, reverse) for s in usable]
        offsets = np.cumsum([0] + [len(t) for t in stream])
        # The stream ends with `length` pad tokens, so a gather never runs past the array.
        self.tokens = np.concatenate(stream + [np.full(self.length, SPACE_ID, np.int64)])
        starts, valid = [], []
        for s, off in zip(usable, offsets[:-1]):
            n = len(s)
            j = np.arange(max(1, n - terms + 1), dtype=np.int64)
            starts.append(off + j * (digits + 1))
            valid.append(np.minimum(terms, n - j) * (digits + 1))
        self.starts = np.concatenate(starts)
        self.valid = np.concatenate(valid)  # tokens of the window that belong to its sequence

    @property
    def block_size(self) -> int:
        return self.length - 1

    def __len__(self) -> int:
        return len(self.starts)

    def batch(self, which: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Windows number `which`: x (B, T) and y (B, T) with IGNORE_INDEX where not scored."""
        idx = self.starts[which][:, None] + np.arange(self.length)
        window = self.tokens[idx]
        inside = np.arange(self.length)[None, :] < self.valid[which][:, None]
        x = np.where(inside[:, :-1], window[:, :-1], SPACE_ID)
        y = np.where(inside[:, 1:], window[:, 1:], IGNORE_INDEX)
        # y[t] is token t+1; tokens 0 .. g(D+1)-1 belong to the g given terms and their spaces.
        if self.mask_given:
            y[:, :self.mask_given * (self.digits + 1) - 1] = IGNORE_INDEX
        return x, y

    def fixed(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """`n` windows evenly spread over all starts (the same every call): validation."""
        which = np.linspace(0, len(self) - 1, min(n, len(self))).round().astype(np.int64)
        return self.batch(which)


class TermWindowSampler(RandomSampler):
    """Random batches of `TermWindows` for the trainer (the shared samplers' protocol; its
    state is its RNG's)."""

    def __init__(self, windows: TermWindows, batch_size: int, seed: int):
        self.windows, self.B = windows, batch_size
        self.rng = np.random.default_rng(seed)

    def next_batch(self) -> tuple[np.ndarray, np.ndarray]:
        return self.windows.batch(self.rng.integers(0, len(self.windows), size=self.B))
