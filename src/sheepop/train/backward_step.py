"""One training step, backwards, by the NumPy engine's hand-written backward pass (the page's
"Backprop" view; docs/math/08-loss.md, 09-backprop.md).

For a text x_0 .. x_T the inputs are x_0 .. x_{T-1}, the targets y_t = x_{t+1}, and

    L    = (1/N) sum_t (log sum_j exp z_t[j] - z_t[y_t])        N = T counted targets
    dZ   = (P - Y) / N                                          P = softmax(Z), Y one-hot of y
    dW   = gpt_backward(...)                                    every weight's dL/dW (part 9)

`gpt_forward` and `gpt_backward` are the engine's own top-level entry points, the ones the
NumPy trainer (train/engine_numpy.py) calls; no dropout (an evaluation-mode step). dZ is
formed here from the forward's logits, in float64, for showing; the gradients are the engine's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sheepop.config.schema import ModelConfig
from sheepop.scratch.gpt import gpt_backward, gpt_forward
from sheepop.softmax import softmax


@dataclass
class BackwardStep:
    ids: list[int]             # the text: inputs ids[:-1], targets ids[1:]
    loss: float                # L, the engine's
    probs: np.ndarray          # P (N, V) float64: softmax of the logits
    dz: np.ndarray             # (P - Y) / N (N, V) float64
    grads: dict[str, np.ndarray]   # dL/dW for every weight, in the order of `weights`


def backward_step(weights: dict[str, np.ndarray], cfg: ModelConfig, ids: list[int]
                  ) -> BackwardStep:
    """The loss of `ids` (2 .. block_size + 1 tokens) and every weight's gradient."""
    x = np.asarray([ids[:-1]], dtype=np.int64)
    y = np.asarray([ids[1:]], dtype=np.int64)
    logits, loss, cache = gpt_forward(weights, cfg, x, y)
    z = logits[0].astype(np.float64)
    p = softmax(z)
    dz = p.copy()
    dz[np.arange(len(ids) - 1), y[0]] -= 1.0
    dz /= len(ids) - 1
    grads = gpt_backward(cache)  # (in the backward order: the head first)
    ordered = {name: grads[name] for name in weights if name in grads}
    return BackwardStep(list(ids), float(loss), p, dz, ordered)
