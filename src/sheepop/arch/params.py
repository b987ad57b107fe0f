"""Initialisation and weight-decay rules, by parameter name (the same in both engines).

    gains (ln1, ln2, ln_f .weight)           1
    biases                                   0
    residual projections (attn.proj,         N(0, (0.02 / sqrt(2 n_layer))^2), or 0 with
      ffn.proj .weight)                        model.zero_init_proj
    every other weight (embeddings, linear)  N(0, 0.02^2)
    value-embedding lambdas                  1/2: v = (v + T[x]) / 2 at step 0 (modded-nanogpt)
    skip weights                             1: each skip adds the whole kept output

Each block adds two residual branches to the stream; scaling their output projections by
1/sqrt(2 n_layer) keeps the variance of the residual stream from growing with depth (GPT-2).
Zero projections (modded-nanogpt's) go further: every block starts as the identity, and the
first step's gradient reaches only the projections (dA = dY W_proj = 0 for the rest), which
then open each branch as far as the loss asks.
Weight decay applies to matrices only (ndim >= 2): never to biases or norm gains.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from sheepop.errors import UserError
from sheepop.files import shown

INIT_STD = 0.02
GAINS = ("ln1.weight", "ln2.weight", "ln_f.weight", "skips.weights")
HALVES = ("value_embeds.lambdas",)
RESIDUAL_PROJECTIONS = ("attn.proj.weight", "ffn.proj.weight")


def init_rule(name: str, n_layer: int, zero_proj: bool = False) -> tuple[str, float]:
    """("ones" | "zeros" | "fill" | "normal", the standard deviation or the fill value) for the
    parameter called `name`."""
    if name.endswith(GAINS):
        return "ones", 0.0
    if name.endswith(HALVES):
        return "fill", 0.5
    if name.endswith("bias"):
        return "zeros", 0.0
    if name.endswith(RESIDUAL_PROJECTIONS):
        if zero_proj:
            return "zeros", 0.0
        return "normal", INIT_STD / math.sqrt(2 * n_layer)
    return "normal", INIT_STD


def check_shapes(found: Mapping[str, Sequence[int]], expected: Mapping[str, Sequence[int]],
                 where: str) -> None:
    """`found` (name -> shape: a checkpoint's tensors) names exactly the `expected` parameters,
    each of its shape; one UserError naming the first difference otherwise."""
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    if missing or unexpected:
        raise UserError(f"{where} does not match the model config: missing {missing[:3]}, "
                        f"unexpected {[shown(n) for n in unexpected[:3]]}")
    for name, shape in expected.items():
        if tuple(found[name]) != tuple(shape):
            raise UserError(f"{where}: {name} has shape {tuple(found[name])}, the config "
                            f"expects {tuple(shape)}")


def decays(shape: Sequence[int]) -> bool:
    """AdamW's parameter groups: decoupled weight decay on tensors with ndim >= 2 only."""
    return len(shape) >= 2


def uses_muon(name: str, shape: Sequence[int]) -> bool:
    """The optimizer groups of `train.optimizer = "muon"`, for both engines: Muon for the
    matrices inside the blocks (attention and feed-forward weights: their updates are
    orthogonalised), AdamW for everything else. An embedding row is a lookup, not a map, and
    the head's rows are read one token at a time, so neither gets the whole-matrix update
    (nanochat and modded-nanogpt group them the same way); gains and biases are vectors. The
    value-embedding tables are embeddings too (AdamW, decayed as the token table is), and their
    lambdas and the skip weights scalars (AdamW, not decayed): modded-nanogpt gives both to
    Adam."""
    return name.startswith("blocks.") and len(shape) == 2
