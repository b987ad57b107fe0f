"""`POST /v1/patch`: activation patching on the served model (docs/experiments.md), the grid
and its first-order estimate.

    "clean", "corrupted"   two prompts of one length in tokens: strings or lists of token ids
    "answer", "wrong"      the two tokens the metric m = z[answer] - z[wrong] compares (at the
                           last position): a string of one token, or a token id
    "kind"                 "positions" (block l's output at position t) or "heads" (head h's
                           output at every position, or at "position" alone)
    "layers"               the rows, block indices (default: every block)
    "attribution"          false: leave out the estimate (default true)
    "logit_attribution"    true: add the direct logit attribution of m on each prompt
                           (default false)

The answer: "scores" (rows x columns) (m_patched - m_corrupted) / (m_clean - m_corrupted) of the
exact grid (sheepop.inference.patching: one forward pass a cell) and "metric" its m's,
"clean_metric" and "corrupted_metric", and with "attribution" the same two of the estimate
(sheepop.inference.attribution: one forward and one backward pass), and with
"logit_attribution" each part's share of m at the last position of each prompt, "names" and
the "clean" and "corrupted" "shares" (sheepop.inference.logit_attribution: the answer's shares
minus the wrong token's, four forward passes), all computed by the model's own engine on the
scheduler's thread between two decode steps. A prompt longer than
MAX_TOKENS, or a grid of more than MAX_PASSES forward passes, is refused with a 400 naming the
field to change.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
from starlette.routing import Route

from sheepop.errors import UserError
from sheepop.files import shown
from sheepop.inference.attribution import attribution_grid
from sheepop.inference.hooked_engines import HookedEngine, NoGradients, hooked_engine
from sheepop.inference.load import InferenceModel
from sheepop.inference.logit_attribution import logit_shares
from sheepop.inference.patching import (
    KINDS,
    Contrast,
    ContrastError,
    PatchGrid,
    contrast,
    patch_grid,
)
from sheepop.serve.api.protocol import bad
from sheepop.serve.page.inside_view import _token_ids
from sheepop.serve.page.view_endpoint import Computation, Text, view_endpoint
from sheepop.tokenizers import Tokenizer

MAX_TOKENS = 64
"""Tokens of each prompt: a cell is one forward pass over them."""
MAX_PASSES = 2048
"""Forward passes of one grid (rows x columns): SmolLM2's 30 blocks x 64 positions is 1,920."""
DIGITS = 7


def _prompt(body: dict, name: str, tokenizer: Tokenizer) -> list[int]:
    p = body.get(name)
    if isinstance(p, str) and p:
        return tokenizer.encode(p)
    if isinstance(p, list) and p:
        return _token_ids(p, name, tokenizer)
    raise bad(name, f"'{name}' must be a non-empty string or list of token ids, not {shown(p)}")


def _token(body: dict, name: str, tokenizer: Tokenizer) -> int:
    t = body.get(name)
    if type(t) is int:
        return t  # (checked against the vocabulary with the contrast)
    if isinstance(t, str) and t:
        ids = tokenizer.encode(t)
        if len(ids) == 1:
            return ids[0]
        raise bad(name, f"'{name}' must be one token: {shown(t)} is {len(ids)} tokens "
                        f"({ids}); give one of them as a token id")
    raise bad(name, f"'{name}' must be a string of one token or a token id, not {shown(t)}")


def _flag(body: dict, name: str, default: bool) -> bool:
    value = body.get(name, default)
    if type(value) is not bool:
        raise bad(name, f"'{name}' must be true or false, not {shown(value)}")
    return value


def _grid_options(body: dict, n_layer: int, T: int) -> tuple[str, list[int], int | None, bool]:
    kind = body.get("kind", "positions")
    if kind not in KINDS:
        raise bad("kind", f"'kind' must be one of {', '.join(KINDS)}, not {shown(kind)}")
    layers = body.get("layers", list(range(n_layer)))
    if not isinstance(layers, list) or not layers or not all(
            type(i) is int and 0 <= i < n_layer for i in layers):
        raise bad("layers", f"'layers' must be a non-empty list of block indices "
                            f"0..{n_layer - 1}, not {shown(layers)}")
    position = body.get("position")
    if position is not None and (kind != "heads" or type(position) is not int
                                 or not 0 <= position < T):
        raise bad("position", f"'position' is for kind 'heads': a position 0..{T - 1}, not "
                              f"{shown(position)}")
    return kind, sorted(set(layers)), position, _flag(body, "attribution", True)


def _checked(body: dict, model: InferenceModel):
    tokenizer, m = model.tokenizer, model.config.model
    clean, corrupted = _prompt(body, "clean", tokenizer), _prompt(body, "corrupted", tokenizer)
    if len(clean) > min(MAX_TOKENS, m.block_size):
        raise bad("clean", f"the clean prompt holds {len(clean)} tokens; patching takes up to "
                           f"{min(MAX_TOKENS, m.block_size)} (each cell is a forward pass)")
    answer, wrong = _token(body, "answer", tokenizer), _token(body, "wrong", tokenizer)
    try:
        c = contrast(clean, corrupted, answer, wrong, m.vocab_size)
    except ContrastError as e:
        raise bad(e.field, str(e)) from None
    kind, layers, position, attribution = _grid_options(body, m.n_layer, len(clean))
    passes = len(layers) * (len(clean) if kind == "positions" else m.n_head)
    if passes > MAX_PASSES:
        raise bad("layers", f"that grid is {passes} forward passes, more than this server "
                            f"runs at once ({MAX_PASSES}): ask for fewer 'layers'")
    return c, kind, layers, position, attribution


def _shares_json(engine: HookedEngine, c: Contrast) -> dict[str, Any]:
    """Each part's share of m on each prompt: the answer's logit's shares minus the wrong's."""
    out: dict[str, Any] = {}
    for prompt, ids in (("clean", c.clean), ("corrupted", c.corrupted)):
        try:
            up, down = logit_shares(engine, ids, c.answer), logit_shares(engine, ids, c.wrong)
        except UserError as e:  # (a soft-capped logit, U-net skips: no sum of shares)
            raise bad("logit_attribution", f"{e} ('logit_attribution': false)") from None
        out["names"] = up.names
        out[prompt] = {"shares": np.round(up.shares - down.shares, DIGITS).tolist()}
    return out


def _grid_json(grid: PatchGrid) -> dict[str, Any]:
    return {"scores": np.round(grid.scores, DIGITS).tolist(),
            "metric": np.round(grid.metric, DIGITS).tolist()}


async def _prepare(body: dict, model: InferenceModel, text: Text) -> Computation:
    c, kind, layers, position, attribution = await asyncio.to_thread(_checked, body, model)
    shares = _flag(body, "logit_attribution", False)

    def run(m: InferenceModel) -> dict[str, Any]:
        engine = hooked_engine(m)
        with np.errstate(over="ignore", invalid="ignore"):
            exact = patch_grid(engine, c, kind, layers, position)
            try:
                estimate = (attribution_grid(engine, c, kind, layers, position) if attribution
                            else None)
            except NoGradients as e:  # (int8, int4): the exact grid alone can be asked
                raise bad("attribution", f"{e} ('attribution': false)") from None
        out = {"object": "patch", "kind": kind, "layers": exact.layers,
               "columns": exact.columns, "position": exact.position,
               "clean": [{"id": i, "text": text(i)} for i in c.clean],
               "corrupted": [{"id": i, "text": text(i)} for i in c.corrupted],
               "answer": {"id": c.answer, "text": text(c.answer)},
               "wrong": {"id": c.wrong, "text": text(c.wrong)},
               "clean_metric": exact.clean, "corrupted_metric": exact.corrupted,
               **_grid_json(exact)}
        if estimate is not None:
            out["attribution"] = _grid_json(estimate)
        if shares:
            out["logit_attribution"] = _shares_json(engine, c)
        return out

    return run


ROUTES = [Route("/v1/patch", view_endpoint(_prepare), methods=["POST"])]
