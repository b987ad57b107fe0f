"""`/v1/inspect`: the mathematics of the served model on one prompt, as JSON (docs/page.md).

    GET  /v1/inspect   the model's shape: layers, heads, context, position kind, chat or not,
                       and the server's sampling defaults (the page starts from them)
    POST /v1/inspect   {"prompt": "text" | [ids]} or {"messages": [...]} (a chat model's
                       conversation through its chat template, sheepop's or the model's
                       own, with the assistant's turn opened), "top" (1..20, default 5),
                       "layers" (the attention of these layers only; default all), "lens"
                       (false: neither compute nor send the logit lens: on a 49k vocabulary
                       it is most of the time), "generated" (token ids appended after the
                       prompt or the opened assistant turn: what the model generated),
                       "logits_at" (a position: its final logits z, all V of them, as
                       little-endian float32 in base64, for a client to sample from)

The answer, computed by the model's own engine on the scheduler's thread between two decode
steps (sheepop.inference.load.inspect): `attention.weights[l][h][t]` is row t of layer l's head h,
query t over keys 0..t (the causal triangle; the zeros above it are left out), rounded to 7
decimals; `lens` the top tokens each layer's residual stream predicts at each position through
the final norm and the head; `next` the model's own next-token distribution at each position;
`positions` the positional encoding in use. Every distribution excludes the model's
never-generated ids (`never_generate`: padding, BOS, unknown), as its sampler and the API's
logprobs do, so one token's p is the same number in every view. A prompt longer than the
context, or an answer larger than MAX_ATTENTION_CELLS weights, is refused with a 400 that says
what to ask instead.
"""

from __future__ import annotations

import asyncio
import base64
import math
from collections.abc import Callable
from typing import Any

import anyio
import numpy as np
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse
from starlette.routing import Route

from sheepop.arch.inspection import Inspection, TopK, top_k
from sheepop.errors import UserError
from sheepop.files import shown
from sheepop.inference.load import InferenceModel, inspect
from sheepop.serve.api.app import read_json
from sheepop.serve.api.json_out import FiniteJSONResponse
from sheepop.serve.api.protocol import ApiError, bad
from sheepop.tokenizers import Tokenizer
from sheepop.tokenizers.chat_format import can_chat, chat_ids, message_problem

MAX_TOP = 20
MAX_ATTENTION_CELLS = 1 << 21
"""Attention weights in one answer (about 20 MB of JSON): more must be asked layer by layer."""

EMBEDDING = "embedding"  # the lens of h_0; h_l is "block l"
POSITION_FORMULAS = {
    "sinusoidal": "P[t, 2i] = s sin(t / 10000^(2i/d)), P[t, 2i+1] = s cos(t / 10000^(2i/d))",
    "learned": "P[t] = row t of the learned table pos_emb.weight",
    "rope": "angle[t, i] = t * theta^(-2i/d_k): pair i of each query and key turns by it",
    "rope_terms": "angle[t, i] = n(t) * theta^(-2i/d_k), n(t) the index of the number token t "
                  "belongs to: pair i of each query and key turns by it",
    "rope_places": "angle[t, i] = n(t) * theta^(-4i/d_k) for i < d_k/4, r(t) * "
                   "theta^(-4(i - d_k/4)/d_k) after, n(t) the index of the number token t "
                   "belongs to and r(t) its place in it: pair i of each query and key turns by it",
    "none": "no positional encoding: attention alone tells positions apart (through the mask)",
}


def describe(model: InferenceModel, name: str, vectors: dict[str, Any] | None = None
             ) -> dict[str, Any]:
    m, s = model.config.model, model.config.sample
    chat = model.tokenizer is not None and can_chat(model.tokenizer)
    return {"object": "model.shape", "model": name, "engine": model.engine,
            "n_layer": m.n_layer, "n_head": m.n_head, "n_kv_head": m.kv_heads,
            "n_embd": m.n_embd, "context": m.block_size, "vocab_size": m.vocab_size,
            "pos_encoding": m.pos_encoding, "norm": m.norm, "ffn": m.ffn, "chat": chat,
            "tied": m.tie_weights,
            "max_attention_cells": MAX_ATTENTION_CELLS,
            # the server's sampling defaults (the run's [sample] and serve's flags): the page's
            "sampling": {k: getattr(s, k) for k in ("temperature", "top_k", "top_p", "min_p")},
            # the steering vectors a request may name (serve --steer; docs/steering.md)
            "steering": [{"name": n, "layer": v.layer} for n, v in (vectors or {}).items()]}


def _prompt_ids(body: dict, tokenizer: Tokenizer) -> list[int]:
    """The prompt's token ids: a string, a list of ids, or a conversation's messages."""
    if "messages" in body:
        if not can_chat(tokenizer):
            raise bad("messages", "this model has no chat template: give a 'prompt'",
                      code="no_chat_template")
        messages = body["messages"]
        problem = (message_problem(messages) if isinstance(messages, list)
                   else "'messages' must be a list")
        if problem is not None:
            raise bad("messages", f"not a conversation: {problem}")
        try:
            return chat_ids(tokenizer, messages, add_generation_prompt=True)[0]
        except UserError as e:
            raise bad("messages", str(e)) from None
    p = body.get("prompt")
    if isinstance(p, str) and p:
        return tokenizer.encode(p)
    if isinstance(p, list) and p:
        return _token_ids(p, "prompt", tokenizer)
    raise bad("prompt", "'prompt' must be a non-empty string or list of token ids, not "
                        f"{shown(p)}")


def _token_ids(ids: Any, name: str, tokenizer: Tokenizer) -> list[int]:
    if not isinstance(ids, list) or not all(type(i) is int for i in ids):
        raise bad(name, f"'{name}' must be a list of token ids, not {shown(ids)}")
    wrong = next((i for i in ids if not 0 <= i < tokenizer.vocab_size), None)
    if wrong is not None:
        raise bad(name, f"token id {wrong} is outside the vocabulary "
                        f"(0..{tokenizer.vocab_size - 1})")
    return list(ids)


def _options(body: dict, n_layer: int) -> tuple[int, list[int], bool]:
    top = body.get("top", 5)
    if type(top) is not int or not 1 <= top <= MAX_TOP:
        raise bad("top", f"'top' must be an integer between 1 and {MAX_TOP}, not {shown(top)}")
    layers = body.get("layers", list(range(n_layer)))
    if not isinstance(layers, list) or not all(type(i) is int and 0 <= i < n_layer
                                               for i in layers):
        raise bad("layers", f"'layers' must be a list of layer indices 0..{n_layer - 1}, not "
                            f"{shown(layers)}")
    lens = body.get("lens", True)
    if type(lens) is not bool:
        raise bad("lens", f"'lens' must be true or false, not {shown(lens)}")
    return top, sorted(set(layers)), lens


def _checked(body: Any, model: InferenceModel, name: str
             ) -> tuple[list[int], int, list[int], bool, tuple[int, ...]]:
    if not isinstance(body, dict):
        raise bad(None, "the request body must be a JSON object")
    if body.get("model") not in (None, name):
        raise ApiError(404, f"the model {shown(body.get('model'))} does not exist: this server "
                            f"serves '{name}'", param="model", code="model_not_found")
    m = model.config.model
    ids = _prompt_ids(body, model.tokenizer)
    ids += _token_ids(body.get("generated", []), "generated", model.tokenizer)
    if len(ids) > m.block_size:
        raise bad("prompt", f"This model's maximum context length is {m.block_size} tokens; "
                            f"the prompt holds {len(ids)}. Inspect a shorter prompt.",
                  code="context_length_exceeded")
    top, layers, lens = _options(body, m.n_layer)
    cells = len(layers) * m.n_head * len(ids) * (len(ids) + 1) // 2
    if cells > MAX_ATTENTION_CELLS:
        raise bad("layers", f"the attention of {len(layers)} layer(s) on {len(ids)} tokens is "
                            f"{cells} weights, more than this server answers at once "
                            f"({MAX_ATTENTION_CELLS}): ask for fewer 'layers'",
                  code="response_too_large")
    at = body.get("logits_at")
    if at is not None and (type(at) is not int or not 0 <= at < len(ids)):
        raise bad("logits_at", f"'logits_at' must be a position 0..{len(ids) - 1} of the "
                               f"{len(ids)} tokens, not {shown(at)}")
    return ids, top, layers, lens, () if at is None else (at,)


def _top(top: TopK, text: Callable[[int], str]) -> dict[str, Any]:
    """ids, texts and probabilities of the top tokens, in the shape of `top.ids`."""
    texts = np.vectorize(text, otypes=[object])(top.ids) if top.ids.size else top.ids
    return {"ids": top.ids.tolist(), "texts": texts.tolist(), "probs": top.probs.tolist()}


def _maybe(values: np.ndarray) -> list:
    """NaN (no next token: the prompt's last position) as JSON's null."""
    return [None if math.isnan(v) else v for v in values.tolist()]


def to_json(x: Inspection, layers: list[int], lens: bool, text: Callable[[int], str],
            name: str, never: tuple[int, ...] = ()) -> dict[str, Any]:
    """The JSON answer of an `Inspection` (see the module's docstring)."""
    weights = [[[row[:t + 1] for t, row in enumerate(np.round(head.astype(np.float64), 7)
                                                      .tolist())]
                for head in x.attention[layer]] for layer in layers]
    out: dict[str, Any] = {
        "object": "inspection", "model": name,
        "tokens": [{"id": i, "text": text(i)} for i in x.ids],
        "n_layer": x.n_layer, "n_head": x.n_head,
        "attention": {"layers": layers, "weights": weights},
        "next": {**_top(x.next, text), "next_prob": _maybe(x.next_prob),
                 "entropy": x.next_entropy.tolist()},
        "never_generate": list(never),
        "positions": {"kind": x.positions_kind, "values": x.positions.tolist(),
                      "columns": x.position_columns,
                      "formula": POSITION_FORMULAS[x.positions_kind]},
    }
    if lens and x.lens is not None:
        out["lens"] = _lens_json(x, text)
    for t, z in x.logits.items():  # (-inf stays -inf in float32: a never-generated id)
        out["logits"] = {"position": t, "vocab_size": len(z),
                         "float32": base64.b64encode(z.astype("<f4").tobytes()).decode(),
                         "texts": _named(z, x.ids[:t + 1], text)}
    return out


def _lens_json(x: Inspection, text: Callable[[int], str]) -> dict[str, Any]:
    """The logit lens: after the embedding and after each block, the top tokens, the actual next
    token's probability and rank, the entropy and the KL divergence from the final layer's."""
    names = [EMBEDDING] + [f"block {i}" for i in range(1, x.n_layer + 1)]
    return {"layers": names, **_top(x.lens, text),
            "next_prob": [_maybe(row) for row in x.lens_next],
            "rank": [[int(r) or None for r in row] for row in x.lens_rank],
            "entropy": x.lens_entropy.tolist(), "kl": x.lens_kl.tolist()}


NAMED = 64
"""Tokens named beside a position's logits: the likeliest NAMED, and the likeliest NAMED not
yet in the text (the first ones a repetition penalty lifts): what a client lists."""


def _named(z: np.ndarray, seen: list[int], text: Callable[[int], str]) -> dict[str, str]:
    fresh = z.copy()
    fresh[seen] = -np.inf
    ids = np.union1d(top_k(z[None], NAMED)[0], top_k(fresh[None], NAMED)[0])
    return {str(i): text(int(i)) for i in ids}


def _finite(x: Inspection) -> bool:
    """Whether the inspection's numbers are finite (next_prob's NaN at the last position is
    by design)."""
    arrays = [*x.attention.values(), x.next.probs, x.positions]
    if x.lens is not None:
        arrays.append(x.lens.probs)
    return all(np.isfinite(a).all() for a in arrays)


async def shape(request: HttpRequest) -> JSONResponse:
    st = request.app.state
    return JSONResponse(describe(st.model, st.settings.name, st.settings.vectors))


async def inspect_prompt(request: HttpRequest) -> JSONResponse:
    st = request.app.state
    body = await read_json(request, st.settings.max_body)
    # (off the event loop: a chat template renders here, for up to its bound of seconds)
    ids, top, layers, lens, at = await asyncio.to_thread(_checked, body, st.model,
                                                         st.settings.name)
    future = st.scheduler.call(lambda model: inspect(model, ids, top, lens, at, layers))
    result = await asyncio.wrap_future(future)
    if not _finite(result):
        raise ApiError(422, "the model's activations are not finite (NaN or infinite: its "
                            "weights overflow), so there is nothing to inspect",
                       code="non_finite_logits")
    text = lambda i: st.texts(i)[0]  # noqa: E731
    never = tuple(st.model.lm.never_generate)
    out = await anyio.to_thread.run_sync(to_json, result, layers, lens, text, st.settings.name,
                                         never)
    if result.positions_kind == "sinusoidal":  # the formula's s
        out["positions"]["scale"] = st.model.config.model.sinusoid_scale
    return FiniteJSONResponse(out)


ROUTES = [Route("/v1/inspect", shape, methods=["GET"]),
          Route("/v1/inspect", inspect_prompt, methods=["POST"])]
