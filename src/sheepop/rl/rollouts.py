"""Sampling answers and scoring them: a step's groups, and the held-out pass@1.

Every answer comes from the batched generator (sheepop.generation.generate.generate_batch: one
KV cache for the whole batch, each row leaving when it ends), run on a model built from the
policy's current weights by the one inference module (sheepop.inference.load.build). Row j of
step s draws from its own generator seeded by (train.seed, s, j), so a resumed run samples
exactly the answers the uninterrupted one did. Sampling uses the policy's own distribution at
rl.temperature (no top-k, top-p or min-p cut: the loss's log-probabilities are those of the
untruncated policy).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sheepop.config.schema import SampleConfig
from sheepop.generation.generate import generate_batch_ids
from sheepop.inference.load import InferenceModel
from sheepop.rl.tasks import Record
from sheepop.rl.verifiers import Verifier


@dataclass
class Answers:
    prompts: list[list[int]]   # each row's prompt ids (a prompt repeated k times)
    tokens: list[list[int]]    # each row's answer ids (its end token included when it ended)
    texts: list[str]           # the answers' text, the end token left out
    rewards: np.ndarray        # (N,) the verifier's


def row_seeds(seed: int, step: int, rows: int) -> list[int]:
    """One seed for each row of step `step`, the same for a resumed run."""
    state = np.random.SeedSequence([seed, step]).generate_state(rows, np.uint64)
    return [int(s) >> 1 for s in state]  # (below 2**63: numpy seeds are non-negative ints)


def sample_answers(model: InferenceModel, records: Sequence[Record],
                   prompts: Sequence[list[int]], k: int, verifier: Verifier, eos_id: int | None,
                   max_new_tokens: int, temperature: float, seeds: Sequence[int] | None
                   ) -> Answers:
    """k answers to each prompt (rows prompt by prompt: group g is rows g k .. g k + k - 1),
    scored; `temperature` 0 with k 1: the greedy answers (pass@1)."""
    rows = [list(p) for p in prompts for _ in range(k)]
    cfg = SampleConfig(max_new_tokens=max_new_tokens, temperature=temperature, top_k=0,
                       top_p=1.0, min_p=0.0, seed=0)
    tokens = generate_batch_ids(model.lm, rows, cfg, eos_id=eos_id, seeds=seeds)
    texts = [model.tokenizer.decode([t for t in ids if t != eos_id]) for ids in tokens]
    rewards = np.array([verifier(text, records[j // k]) for j, text in enumerate(texts)],
                       np.float64)
    return Answers(rows, tokens, texts, rewards)


def pass_at_1(model: InferenceModel, records: Sequence[Record], prompts: Sequence[list[int]],
              verifier: Verifier, eos_id: int | None, max_new_tokens: int) -> float:
    """The share of held-out prompts whose greedy answer scores 1 (a full reward)."""
    if not records:
        return float("nan")
    answers = sample_answers(model, records, prompts, 1, verifier, eos_id, max_new_tokens,
                             0.0, None)
    return float((answers.rewards >= 1.0).mean())
