"""(input, target) windows cut from a flat token stream.

A window of T tokens starting at s is  x = tokens[s : s+T],  y = tokens[s+1 : s+T+1]:
target t is the token that follows input t.

Two ways to choose windows:
- `random`: B starts drawn uniformly from [0, N - T - 1] per batch (as nanoGPT does);
- `chunks`: starts 0, stride, 2*stride, ... covering the stream in order (shuffled each epoch);
  the last chunk is padded: inputs with `pad_id`, targets with IGNORE_INDEX (-1), so the loss
  skips them.

The sampler's position and RNG state round-trip through JSON, so a resumed run draws exactly
the batches an uninterrupted run would have drawn.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sheepop.arch import IGNORE_INDEX
from sheepop.errors import UserError


def chunk_starts(n_tokens: int, block_size: int, stride: int) -> np.ndarray:
    """Starts of the windows that cover n_tokens - 1 (input, target) pairs with `stride`."""
    pairs = n_tokens - 1
    if pairs < 1:
        return np.zeros(0, dtype=np.int64)
    last = max(0, pairs - block_size)
    starts = np.arange(0, last + 1, stride, dtype=np.int64)
    if starts[-1] + block_size < pairs:  # a tail the stride skipped: one more (padded) window
        starts = np.append(starts, starts[-1] + stride)
    return starts


def window(tokens: np.ndarray, start: int, block_size: int, pad_id: int
           ) -> tuple[np.ndarray, np.ndarray]:
    """One (x, y) pair of length T; positions past the stream are padded (y = -1)."""
    x = np.full(block_size, pad_id, dtype=np.int64)
    y = np.full(block_size, IGNORE_INDEX, dtype=np.int64)
    piece = np.asarray(tokens[start:start + block_size + 1], dtype=np.int64)
    n = max(0, len(piece) - 1)
    x[:n] = piece[:n]
    y[:n] = piece[1:n + 1]
    return x, y


class RandomSampler:
    """A sampler whose whole state is its random generator `rng` (the trainer's protocol:
    `snapshot()` before a step's batches, `state()` to save, `set_state()` on resume)."""

    rng: np.random.Generator

    def snapshot(self) -> dict[str, Any]:
        return {"rng": self.rng.bit_generator.state}

    def state(self, snapshot: dict[str, Any] | None = None) -> dict[str, Any]:
        """JSON-able: the current state, or that of an earlier `snapshot()`."""
        return dict(snapshot or self.snapshot())

    def set_state(self, state: dict[str, Any]) -> None:
        restore_rng(self.rng, state)


def restore_rng(rng: np.random.Generator, state: Any) -> None:
    """`rng` set to the state a sampler saved in trainer.json ({"rng": the bit generator's
    state}); anything else is one UserError line, not a TypeError from NumPy."""
    try:
        if not isinstance(state, dict) or not isinstance(state.get("rng"), dict):
            raise TypeError("no \"rng\" object")
        rng.bit_generator.state = state["rng"]
    except (KeyError, TypeError, ValueError, OverflowError) as e:
        raise UserError(f"trainer.json: the sampler state is not one sheepop saved ({e}); "
                        "the checkpoint is damaged") from None


class WindowSampler:
    def __init__(self, tokens: np.ndarray, block_size: int, batch_size: int, seed: int,
                 mode: str = "random", stride: int = 0, pad_id: int = 0, name: str = "train"):
        self.tokens, self.T, self.B = tokens, block_size, batch_size
        self.mode, self.pad_id = mode, pad_id
        self.rng = np.random.default_rng(seed)
        if mode == "random":
            if len(tokens) < block_size + 1:
                raise UserError(f"block_size {block_size} is larger than the {name} data "
                                f"({len(tokens)} tokens): lower model.block_size or add data")
            self.starts = None
        else:
            self.starts = chunk_starts(len(tokens), block_size, stride or block_size)
            if len(self.starts) == 0:
                raise UserError(f"the {name} data has fewer than 2 tokens")
            self.order = self.rng.permutation(len(self.starts))
            self.cursor = 0
            self.epoch = 0

    def next_batch(self) -> tuple[np.ndarray, np.ndarray]:
        if self.starts is None:
            starts = self.rng.integers(0, len(self.tokens) - self.T, size=self.B)
        else:
            starts = np.empty(self.B, dtype=np.int64)
            for b in range(self.B):
                if self.cursor == len(self.order):
                    self.order, self.cursor = self.rng.permutation(len(self.starts)), 0
                    self.epoch += 1
                starts[b] = self.starts[self.order[self.cursor]]
                self.cursor += 1
        pairs = [window(self.tokens, int(s), self.T, self.pad_id) for s in starts]
        return np.stack([p[0] for p in pairs]), np.stack([p[1] for p in pairs])

    def snapshot(self) -> dict[str, Any]:
        """The current state, cheaply (the order array is replaced, never changed in place)."""
        state: dict[str, Any] = {"rng": self.rng.bit_generator.state}
        if self.starts is not None:
            state.update(order=self.order, cursor=self.cursor, epoch=self.epoch)
        return state

    def state(self, snapshot: dict[str, Any] | None = None) -> dict[str, Any]:
        """A JSON-able state: the current one, or that of an earlier `snapshot()`."""
        state = dict(snapshot or self.snapshot())
        if "order" in state:
            state["order"] = np.asarray(state["order"]).tolist()
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        restore_rng(self.rng, state)
        if self.starts is not None:
            n = len(self.starts)
            order, cursor, epoch = (state.get(k) for k in ("order", "cursor", "epoch"))
            if not (isinstance(order, list) and len(order) == n
                    and all(type(i) is int for i in order)
                    and sorted(order) == list(range(n))
                    and type(cursor) is int and 0 <= cursor <= n
                    and type(epoch) is int and epoch >= 0):
                raise UserError("trainer.json: the sampler's order, cursor and epoch are not "
                                f"those of {n} chunks; the checkpoint is damaged")
            self.order = np.asarray(order, dtype=np.int64)
            self.cursor, self.epoch = cursor, epoch


def eval_windows(tokens: np.ndarray, block_size: int, n_windows: int, pad_id: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """A fixed set of evaluation windows, evenly spread over the split (same every time), cut
    after their last target: the columns where every window is padding are left out. A text
    shorter than the context is then one window of its own length, not block_size's (SmolLM2's
    8,192, whose attention over padding took minutes and gigabytes for a sentence), and the loss
    is the same: attention is causal, so no position sees the padding after it."""
    starts = chunk_starts(len(tokens), block_size, block_size)
    if len(starts) > n_windows:
        starts = starts[np.linspace(0, len(starts) - 1, n_windows).round().astype(np.int64)]
    pairs = [window(tokens, int(s), block_size, pad_id) for s in starts]
    x, y = np.stack([p[0] for p in pairs]), np.stack([p[1] for p in pairs])
    width = int(np.flatnonzero((y != IGNORE_INDEX).any(axis=0))[-1]) + 1
    return x[:, :width], y[:, :width]
