"""Groups of sampled answers: their advantages, and their tokens as one training batch.

k answers are sampled for each prompt; their rewards R_1 .. R_k form a group. The advantage of
answer i is its reward less the group's mean, optionally over the group's standard deviation
(docs/derivations/policy-gradient.md, "The group is the baseline"):

    A_i = R_i - mean(R)                      (scale=False: an unbiased baseline, nanochat's form)
    A_i = (R_i - mean(R)) / (std(R) + 1e-4)  (scale=True: GRPO's)

A group whose answers all score alike has A = 0 for each: it teaches nothing, and the share of
groups with any spread (`signal`) says how much of a step's sampling was worth it.

Each answer becomes one row of the batch: x = prompt + answer without its last token, y the
next token at the answer's positions and IGNORE_INDEX at the prompt's and the padding's (right
padding: a real token never attends to a later position, as in sheepop.data.conversations), so the
log-probabilities of y are those of the answer given its prompt.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sheepop.arch import IGNORE_INDEX

STD_FLOOR = 1e-4  # a group whose rewards barely differ is not blown up to unit spread


def group_advantages(rewards: np.ndarray, group_size: int, scale: bool = False) -> np.ndarray:
    """A (N,) for rewards (N,) laid out group by group (N = groups x group_size)."""
    R = np.asarray(rewards, np.float64).reshape(-1, group_size)
    A = R - R.mean(axis=1, keepdims=True)
    if scale:
        A = A / (R.std(axis=1, keepdims=True) + STD_FLOOR)
    return A.reshape(-1)


def signal_share(rewards: np.ndarray, group_size: int) -> float:
    """The share of groups whose rewards are not all equal (the groups that teach)."""
    R = np.asarray(rewards, np.float64).reshape(-1, group_size)
    return float((R.max(axis=1) > R.min(axis=1)).mean())


def answer_batch(prompts: Sequence[Sequence[int]], answers: Sequence[Sequence[int]],
                 pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) int64 (N, T) for row i = prompts[i] + answers[i]: y holds the answer's tokens
    where they are predicted and IGNORE_INDEX elsewhere; T the longest row less one."""
    rows = [list(p) + list(a) for p, a in zip(prompts, answers)]
    T = max(len(r) for r in rows) - 1
    x = np.full((len(rows), T), pad_id, np.int64)
    y = np.full((len(rows), T), IGNORE_INDEX, np.int64)
    for i, (row, prompt) in enumerate(zip(rows, prompts)):
        x[i, :len(row) - 1] = row[:-1]
        start = len(prompt) - 1  # y[start] is the answer's first token
        y[i, start:len(row) - 1] = row[start + 1:]
    return x, y
