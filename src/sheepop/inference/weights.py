"""The weights of a model built for inference, as NumPy arrays, whichever its engine: what the
engine-independent computations read (sheepop.inference.step_trace, the page's step-by-step
view).

    numpy engine   its own float32 parameters (no copy; a matrix held in bfloat16, int8 or
                   4-bit groups, sheepop.scratch.narrow, widened to float32: a copy)
    torch engine   each parameter as a float32 array (a view of a float32 CPU tensor, no copy;
                   a copy for bfloat16 or a GPU)

Keyed by the checkpoint's names; a tied head has no `head.weight` (it is `tok_emb.weight`).
"""

from __future__ import annotations

import numpy as np

from sheepop.inference.load import InferenceModel


def model_weights(model: InferenceModel) -> dict[str, np.ndarray]:
    """The model's weights as float32 NumPy arrays, read-only by contract (never written)."""
    if model.engine == "numpy":  # a matrix held in fewer bytes: its values, widened (a copy)
        return {name: np.asarray(w) for name, w in model.lm.params.items()}
    return model.lm.model.numpy_weights()
