"""The page's step view of a model built for inference (sheepop.arch.trace): the NumPy engine's
forward pass on the model's float32 weights, read at its hook points
(sheepop.scratch.token_steps), whichever engine serves the model: one readable pass, the same
numbers on both.
"""

from __future__ import annotations

from collections.abc import Sequence

from sheepop.arch.trace import TokenTrace
from sheepop.inference.load import InferenceModel
from sheepop.inference.weights import model_weights
from sheepop.scratch.token_steps import trace_token


def step_trace(model: InferenceModel, ids: Sequence[int], position: int, layer: int
               ) -> TokenTrace:
    """Every step of docs/math at `position` and `layer` of the prompt `ids`."""
    return trace_token(model_weights(model), model.config.model, list(ids), position, layer)
