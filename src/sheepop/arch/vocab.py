"""Growing a trained model's vocabulary: rows for new tokens in the embedding and the head.

Fine-tuning on conversations adds special tokens (the roles and the end of a turn) to a
pretrained tokenizer. Their ids come after the existing ones, so every existing row keeps its
meaning; the embedding (and an untied head) get one new row per new token:

    E[v_new] = mean_{j in S(v_new)} E[j],    W_head[v_new] likewise,    b_head[v_new] = mean b[S]

where S(v_new) are the ids the *old* tokenizer writes for the new token's name (`<|user|>` is
spelled `<`, `|`, `u`, `s`, ...; an empty spelling takes every row). A row of zeros, or a
random N(0, 0.02) one, would put every new token at the same point (or at noise) and, with LoRA
freezing the embedding, keep them there; the mean of its spelling starts each one distinct, near
the tokens a reader would associate with it, and at the scale of the trained rows. The rule is
deterministic, so a LoRA run, which saves only its adapters, rebuilds the same rows from its
base run (sheepop.inference.load).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

ROWS_BY_TOKEN = ("tok_emb.weight", "head.weight", "head.bias")
"""The parameters with one row per token id (the head's only when untied / biased)."""


def grow_rows(table: np.ndarray, spellings: Sequence[Sequence[int]]) -> np.ndarray:
    """`table` (V, ...) with one row appended per spelling: the mean of the rows it lists."""
    new = [table[list(ids)].mean(axis=0) if len(ids) else table.mean(axis=0)
           for ids in spellings]
    if not new:
        return table
    return np.concatenate([table, np.stack(new).astype(table.dtype)])


def grow_vocabulary(weights: dict[str, np.ndarray], spellings: Sequence[Sequence[int]]
                    ) -> dict[str, np.ndarray]:
    """The weights of the same model with len(spellings) new token ids at the end."""
    out = dict(weights)
    for name in ROWS_BY_TOKEN:
        if name in out:
            out[name] = grow_rows(out[name], spellings)
    return out
