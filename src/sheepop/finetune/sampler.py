"""Batches of conversations for the shared trainer: padded, drawn at random, resumable.

Each example is one conversation as (x, y) (sheepop.data.conversations): x the token ids, y the next
token where it counts in the loss and IGNORE_INDEX elsewhere. A batch pads every example to the
longest one in it (x with the pad id, y with IGNORE_INDEX: sheepop.data.conversations.pad_examples),
so no conversation attends to another and the padding costs nothing in the loss
(docs/finetune.md says why padding rather than packing). The sampler's state is its RNG
state, like the shared `WindowSampler`'s, so a resumed run draws exactly the batches the
uninterrupted one would have.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sheepop.data.conversations import Example, pad_examples
from sheepop.data.windows import RandomSampler


def fixed_batches(examples: Sequence[Example], n: int, pad_id: int
                  ) -> tuple[np.ndarray, np.ndarray]:
    """The first `n` examples as one padded block (the trainer's fixed validation set)."""
    return pad_examples(list(examples)[:n], pad_id=pad_id)


class ChatSampler(RandomSampler):
    """`batch_size` conversations drawn uniformly with replacement, padded to the longest."""

    def __init__(self, examples: Sequence[Example], batch_size: int, seed: int, pad_id: int):
        self.examples, self.B, self.pad_id = list(examples), batch_size, pad_id
        self.rng = np.random.default_rng(seed)

    def next_batch(self) -> tuple[np.ndarray, np.ndarray]:
        picks = self.rng.integers(0, len(self.examples), size=self.B)
        return pad_examples([self.examples[i] for i in picks], pad_id=self.pad_id)
