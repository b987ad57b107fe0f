"""`POST /v1/backward`: one training step, backwards, on a short text (the page's "Backprop" view;
docs/page.md, docs/math/09-backprop.md).

    {"prompt": "text" | [ids]} or {"messages": [...]}, "position" (the row of dZ shown; default
    the last), "top" (1..20: the rows of dZ's row shown besides the target; default 8)

The answer: the loss L (mean cross-entropy of each token given the ones before it), dZ's row at
the position, dZ_t = (p_t - onehot(y_t)) / N, and the norm of every weight's gradient dL/dW,
grouped by layer, all from the NumPy engine's hand-written backward pass
(sheepop.train.backward_step: gpt_forward, gpt_backward) on the served model's weights, on the
scheduler's thread. tests/arch/test_trace.py checks them against torch autograd.
"""

from __future__ import annotations

import asyncio
import math
import re
from typing import Any

import numpy as np
from starlette.routing import Route

from sheepop.files import shown
from sheepop.inference.load import InferenceModel
from sheepop.inference.weights import model_weights
from sheepop.serve.api.protocol import ApiError, bad
from sheepop.serve.page.inside_view import _prompt_ids
from sheepop.serve.page.view_endpoint import Computation, Text, view_endpoint
from sheepop.tokenizers.token_bytes import perplexity
from sheepop.train.backward_step import BackwardStep, backward_step

MAX_TOKENS = 128
"""Tokens of a text stepped backwards: a real model's gradients are all of its weights (SmolLM2:
135M numbers) whatever the text's length, and its activations grow with it."""


def layer_of(name: str) -> str:
    """The group a weight's gradient is shown in: the embedding, a block, the head."""
    found = re.match(r"blocks\.(\d+)\.", name)
    if found:
        return f"block {int(found.group(1)) + 1}"
    return "final norm and head" if name.startswith(("ln_f.", "head.")) else "embedding"


def _order(layer: str) -> int:
    """The embedding first, then the blocks in order, then the head."""
    if layer == "embedding":
        return -1
    return int(layer.split()[1]) if layer.startswith("block ") else 1 << 30


def to_json(step: BackwardStep, position: int, top: int, text, tied: bool) -> dict[str, Any]:
    n = len(step.ids) - 1
    target = step.ids[position + 1]
    dz, p = step.dz[position], step.probs[position]
    order = [target] + [i for i in np.argsort(-p, kind="stable")[:top + 1].tolist()
                        if i != target][:top]
    rows = [{"id": i, "text": text(i), "p": float(p[i]), "y": int(i == target),
             "dz": float(dz[i])} for i in order]
    groups: dict[str, list[dict[str, Any]]] = {}
    for name, g in step.grads.items():
        norm = float(np.linalg.norm(g.astype(np.float64)))
        groups.setdefault(layer_of(name), []).append(
            {"name": name, "shape": list(g.shape), "norm": norm})
    layers = [{"layer": layer, "params": params,
               "norm": math.sqrt(sum(q["norm"] ** 2 for q in params))}
              for layer, params in groups.items()]
    layers.sort(key=lambda g: _order(g["layer"]))
    return {
        "object": "backward", "engine": "numpy (hand-written backward pass)",
        "tokens": [{"id": i, "text": text(i)} for i in step.ids],
        "loss": step.loss, "n": n, "perplexity": perplexity(step.loss), "position": position,
        "target": {"id": target, "text": text(target), "p": float(p[target])},
        "dz": {"rows": rows, "norm": float(np.linalg.norm(dz)), "sum": float(dz.sum()),
               "size": int(dz.size)},
        "layers": layers, "tied": tied,
        "total_norm": math.sqrt(sum(g["norm"] ** 2 for g in layers)),
    }


async def _prepare(body: dict, model: InferenceModel, text: Text) -> Computation:
    # (off the event loop: a chat template renders here, for up to its bound of seconds)
    ids = await asyncio.to_thread(_prompt_ids, body, model.tokenizer)
    limit = min(MAX_TOKENS, model.config.model.block_size + 1)
    if not 2 <= len(ids) <= limit:
        raise bad("prompt", f"a text stepped backwards holds 2 to {limit} tokens (a target "
                            f"needs a token before it), not {len(ids)}",
                  code="context_length_exceeded" if len(ids) > limit else None)
    position = body.get("position", len(ids) - 2)
    if type(position) is not int or not 0 <= position <= len(ids) - 2:
        raise bad("position", f"'position' must be a predicted position 0..{len(ids) - 2}, "
                              f"not {shown(position)}")
    top = body.get("top", 8)
    if type(top) is not int or not 1 <= top <= 20:
        raise bad("top", f"'top' must be an integer between 1 and 20, not {shown(top)}")

    def run(m: InferenceModel) -> dict[str, Any]:
        with np.errstate(over="ignore", invalid="ignore"):
            step = backward_step(model_weights(m), m.config.model, ids)
        if not math.isfinite(step.loss):
            raise ApiError(422, "the model's loss is not finite (its weights overflow), so "
                                "there is no gradient to show", code="non_finite_logits")
        return to_json(step, position, top, text, m.config.model.tie_weights)

    return run


ROUTES = [Route("/v1/backward", view_endpoint(_prepare), methods=["POST"])]
