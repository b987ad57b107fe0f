"""A steering vector made from two sets of prompts, read through either engine's hook points
(docs/steering.md; sheepop.generation.steering holds the vector, its file and how it is added).

    v = mean_{p in positive} r_l(p) - mean_{q in negative} r_l(q)

r_l(p) is the residual stream out of block l (the point `blocks.l.resid_out`) of prompt p
alone, read at its positions (`positions`):

    mean   the mean over every position but the first, (1 / (T - 1)) sum_{t=1}^{T-1} h_t
           (a one-token prompt: its one position). Every token of a prompt about a topic carries
           it; the first position carries no context and, in models with an attention sink,
           a residual of a far larger norm (SmolLM2 at block 15: ~24,000 against ~180 for the
           others), which would swamp the difference with whichever first tokens the two sets
           happen to have.
    last   h_(T-1) alone: what the model holds when it writes the next token (a prompt that
           ends where the behaviour should start).

Each prompt weighs the same in its set's mean, whatever its length; the sums are in float64.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from sheepop.errors import UserError
from sheepop.files import read_text, shown
from sheepop.generation.steering import POSITIONS, SteeringVector, point_of
from sheepop.inference.load import InferenceModel

MAX_PROMPT_FILE_BYTES = 16 * 2**20


def read_prompts(path: str | Path) -> list[str]:
    """The prompts of a file: one per line, or in a .jsonl file one JSON value per line, a
    string or an object with a "text" or "prompt" string; empty lines skipped. One UserError
    line naming the file and the line when one is not a prompt, or when there is none."""
    text = read_text(path, f"prompt file not found: {path}", "prompt file",
                     MAX_PROMPT_FILE_BYTES)
    prompts = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if str(path).endswith(".jsonl"):
            prompts.append(_json_prompt(line, f"{path}, line {n}"))
        else:
            prompts.append(line)
    if not prompts:
        raise UserError(f"{path} holds no prompt (one a line, or JSONL)")
    return prompts


def _json_prompt(line: str, where: str) -> str:
    try:
        value = json.loads(line)
    except json.JSONDecodeError as e:
        raise UserError(f"{where} is not JSON ({e.msg})") from None
    if isinstance(value, dict):
        value = value.get("text", value.get("prompt"))
    if not isinstance(value, str) or not value:
        raise UserError(f"{where}: a prompt is a JSON string or an object with a \"text\" or "
                        f"\"prompt\" string, not {shown(line)}")
    return value


def residuals(model: InferenceModel, ids: Sequence[int], layer: int) -> np.ndarray:
    """h_(layer+1) (T, d) in float64: the residual stream out of block `layer` at every
    position of the prompt `ids` alone, read at the point blocks.layer.resid_out by the
    model's own engine (no steering, no cache kept)."""
    seen: list[np.ndarray] = []
    point = point_of(layer)
    if model.engine == "numpy":
        from sheepop.scratch.hooks import hooked

        def keep(h, name):
            seen.append(np.array(h[0], dtype=np.float64))
        with hooked(model.config.model, {point: keep}):
            model.lm.full(ids)
    else:
        from sheepop.model.hooks import hooked

        def keep(h, name):
            seen.append(h[0].double().cpu().numpy())
        with hooked(model.lm.model, {point: keep}):
            model.lm.full(ids)
    return seen[0]


def read_at(h: np.ndarray, positions: str) -> np.ndarray:
    """One prompt's residual (d,) from its h (T, d): the mean over positions 1.. (mean; a
    one-token prompt: position 0) or the last position (last)."""
    if positions == "last":
        return h[-1]
    return h[1:].mean(axis=0) if len(h) > 1 else h[0]


def mean_residual(model: InferenceModel, prompts: Sequence[str], layer: int,
                  positions: str, what: str) -> np.ndarray:
    """(1 / n) sum over the prompts of read_at(residuals(prompt)), (d,) float64."""
    tok, T = model.tokenizer, model.config.model.block_size
    total = np.zeros(model.config.model.n_embd)
    for text in prompts:
        ids = tok.encode(text)
        if not 1 <= len(ids) <= T:
            raise UserError(f"a {what} prompt holds {len(ids)} tokens; a prompt holds 1 to "
                            f"{T} (the context): {shown(text)}")
        total += read_at(residuals(model, ids, layer), positions)
    return total / len(prompts)


def make_vector(model: InferenceModel, name: str, positive: Sequence[str],
                negative: Sequence[str], layer: int, positions: str = "mean") -> SteeringVector:
    """The steering vector at block `layer` of the model `model` (named `name`): the
    difference of the mean residuals of the `positive` and the `negative` prompts."""
    cfg = model.config.model
    if not 0 <= layer < cfg.n_layer:
        raise UserError(f"--layer must be 0 to {cfg.n_layer - 1} (the model's blocks), not "
                        f"{layer}")
    if positions not in POSITIONS:
        raise UserError(f"--positions must be one of {', '.join(POSITIONS)}, not {positions!r}")
    model.lm.steer(None)
    v = (mean_residual(model, positive, layer, positions, "positive")
         - mean_residual(model, negative, layer, positions, "negative"))
    return SteeringVector(v.astype(np.float32), layer, name, cfg.n_layer, positions,
                          len(positive), len(negative))
