"""`POST /v1/trace`: one token through the served model, every step of docs/math with its numbers
(the page's "Step" view; docs/page.md).

    {"prompt": "text" | [ids]} or {"messages": [...]}   as /v1/inspect (page.inside_view)
    "continuation"   token texts generated after it (each encoded and appended): a generated
                     token is traced like a prompt token
    "position"       the token t traced (default: the last), "layer" l (default 0)
    "temperature", "top_k", "top_p", "min_p", "repetition_penalty", "seed"   the sampling of z_t
    "full_vocab"     true: the whole z_t and p_t (n_vocab numbers each) come too

The steps (sheepop.arch.trace) are the NumPy engine's forward pass on the model's weights, read
at its hook points (sheepop.inference.step_trace), on the scheduler's thread between two decode
steps; the sampling of z_t is generation's own
(sheepop.generation.sample): the tokens generation never emits (padding, BOS, unknown) set to
-inf (p = softmax(z) is then /v1/inspect's p), the repetition penalty, p_tau = softmax(z / tau),
top-k, top-p, min-p, and the draw u ~ U(0, 1)
from numpy.random.default_rng(seed), the first index where the CDF passes u.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
from starlette.routing import Route

from sheepop.arch.trace import FFNStep, NormStep, TokenTrace
from sheepop.files import shown
from sheepop.generation.sample import draw, penalize_repeats, probabilities
from sheepop.inference.load import InferenceModel, never_generated
from sheepop.inference.step_trace import step_trace
from sheepop.serve.api.protocol import ApiError, bad
from sheepop.serve.page.inside_view import _prompt_ids
from sheepop.serve.page.view_endpoint import Computation, Text, view_endpoint
from sheepop.softmax import softmax

MAX_TOKENS = 1024
"""Tokens a trace reads: every layer forms its (H, T, T) scores (SmolLM2 at 1,024: 38 MB a
layer, 2.4 GB at its context of 8,192)."""
SHOWN_TOKENS = 20
"""Rows of the sampling table: the likeliest tokens after temperature (and the drawn and the
actual next token)."""
DIGITS = 7


def vec(x: np.ndarray) -> list[float]:
    """A vector as JSON: float64, rounded to DIGITS decimals."""
    return np.round(np.asarray(x, dtype=np.float64), DIGITS).tolist()


def _number(body: dict, name: str, default: float, low: float, high: float) -> float:
    """body[name] (default `default`), a number in [low, high] (NaN and infinities are not)."""
    v = body.get(name, default)
    if type(v) not in (int, float) or not (low <= v <= high):
        raise bad(name, f"'{name}' must be a number between {low:g} and {high:g}, not {shown(v)}")
    return float(v)


def _integer(body: dict, name: str, default: int, low: int, high: int) -> int:
    """body[name] (default `default`), an integer in [low, high] (true and false are not)."""
    v = body.get(name, default)
    if type(v) is not int or not low <= v <= high:
        raise bad(name, f"'{name}' must be an integer between {low} and {high}, not {shown(v)}")
    return v


def request_ids(body: dict, model: InferenceModel) -> tuple[list[int], int]:
    """(the prompt's ids and the continuation's after them, how many are the prompt's)."""
    ids = _prompt_ids(body, model.tokenizer)
    prompt = len(ids)
    more = body.get("continuation", [])
    if not isinstance(more, list) or not all(isinstance(s, str) for s in more):
        raise bad("continuation", f"'continuation' must be a list of token texts, not "
                                  f"{shown(more)}")
    for text in more:
        ids += model.tokenizer.encode(text) if text else []
    limit = min(model.config.model.block_size, MAX_TOKENS)
    if len(ids) > limit:
        raise bad("prompt", f"A trace reads at most {limit} tokens (the context, and at most "
                            f"{MAX_TOKENS}); the prompt and continuation hold {len(ids)}. Trace "
                            "a shorter one.", code="context_length_exceeded")
    return ids, prompt


def _norm_json(n: NormStep) -> dict[str, Any]:
    return {"kind": n.kind, "x": vec(n.x), "mean": n.mean, "var": n.var, "x_hat": vec(n.x_hat),
            "y": vec(n.y)}


def _ffn_json(f: FFNStep) -> dict[str, Any]:
    out = {"kind": f.kind, "activation": f.activation, "pre": vec(f.pre), "act": vec(f.act),
           "out": vec(f.out)}
    if f.kind == "swiglu":
        out.update(up=vec(f.up), gate_act=vec(f.gate_act))
    return out


def sampling(z: np.ndarray, ids: list[int], t: int, never: list[int], settings: dict,
             text) -> dict[str, Any]:
    """The distributions of the next token after position t, as generation draws it: p (the
    model's, softmax z with the never-generated ids at -inf, as /v1/inspect and the API's
    logprobs give it), p_tau (repetition penalty, temperature), p_k (top-k), p_p (top-p),
    p_final (min-p), the draw, and the actual next token."""
    tau, k, top_p, min_p, penalty, seed = (
        settings[n] for n in ("temperature", "top_k", "top_p", "min_p", "repetition_penalty",
                              "seed"))
    zz = np.asarray(z, dtype=np.float64).copy()
    zz[never] = -np.inf
    p = softmax(zz)
    seen = np.zeros(zz.shape, dtype=bool)
    seen[ids[:t + 1]] = True
    zz = penalize_repeats(zz, seen, penalty)
    p_tau = probabilities(zz, tau, 0, 1.0)
    p_k = probabilities(zz, tau, k, 1.0)
    p_p = probabilities(zz, tau, k, top_p)
    p_final = probabilities(zz, tau, k, top_p, min_p)
    u = float(np.random.default_rng(seed).random())
    chosen = int(draw(p_final, np.random.default_rng(seed)))
    actual = ids[t + 1] if t + 1 < len(ids) else None
    order = np.argsort(-p_tau, kind="stable")[:SHOWN_TOKENS].tolist()
    order += [i for i in (chosen, actual) if i is not None and i not in order]
    rank = lambda i: int((p > p[i]).sum()) + 1  # noqa: E731
    rows = [{"id": i, "text": text(i), "z": float(z[i]), "p": float(p[i]),
             "p_tau": float(p_tau[i]), "p_k": float(p_k[i]), "p_p": float(p_p[i]),
             "p_final": float(p_final[i]),
             "rank": rank(i)} for i in order]
    return {**settings, "banned": [{"id": i, "text": text(i)} for i in never], "rows": rows,
            "kept_k": int((p_k > 0).sum()), "kept_p": int((p_p > 0).sum()),
            "kept_min_p": int((p_final > 0).sum()),
            "sum_k": float(p_k.sum()), "sum_final": float(p_final.sum()),
            "draw": {"u": u, "id": chosen, "text": text(chosen),
                     "cdf_before": float(p_final[:chosen].sum()),
                     "cdf_at": float(p_final[:chosen + 1].sum())},
            "actual": None if actual is None else {"id": actual, "text": text(actual)}}


def to_json(x: TokenTrace, model: InferenceModel, settings: dict, full_vocab: bool, text,
            prompt_tokens: int) -> dict[str, Any]:
    m = model.config.model
    z = x.logits.astype(np.float64)
    top = np.argsort(-z, kind="stable")[:10].tolist()
    block = {"h_in": vec(x.h_in), "norm1": _norm_json(x.norm1),
             "heads": [{"kv_head": h.kv_head, "q_pre": vec(h.q_pre), "q": vec(h.q),
                        "k_pre": vec(h.k_pre), "k": vec(h.k), "v": vec(h.v), "raw": vec(h.raw),
                        "allowed": h.allowed.tolist(), "weights": vec(h.weights),
                        "out": vec(h.out)} for h in x.heads],
             "concat": vec(x.concat), "attn_out": vec(x.attn_out), "x1": vec(x.x1),
             "norm2": _norm_json(x.norm2), "ffn": _ffn_json(x.ffn), "x2": vec(x.x2)}
    logits = {"size": int(z.size), "norm": float(np.linalg.norm(z)), "min": float(z.min()),
              "max": float(z.max()), "mean": float(z.mean()), "first": vec(z[:8]),
              "top": [{"id": i, "text": text(i), "z": float(z[i])} for i in top]}
    if full_vocab:
        logits["full"] = np.round(z, 4).tolist()
        logits["probs"] = np.round(softmax(np.asarray(z, np.float64)), 9).tolist()
    return {
        "object": "trace", "tokens": [{"id": i, "text": text(i)} for i in x.ids],
        "prompt_tokens": prompt_tokens, "position": x.position, "layer": x.layer,
        "shape": {"n_layer": m.n_layer, "n_head": m.n_head, "n_kv_head": m.kv_heads,
                  "n_embd": m.n_embd, "d_k": m.head_dim, "d_ff": m.ffn_dim,
                  "vocab_size": m.vocab_size, "norm": m.norm, "ffn": m.ffn,
                  "activation": m.activation, "pos_encoding": m.pos_encoding,
                  "eps": m.ln_eps, "rope_theta": m.rope_theta,
                  "pos_scale": m.sinusoid_scale if m.pos_encoding == "sinusoidal" else None,
                  "tied": m.tie_weights, "head_bias": m.head_bias},
        "embedding": {"token": vec(x.token),
                      "position": None if x.pos_term is None else vec(x.pos_term)},
        "stream_norms": x.stream_norms, "block": block,
        "final_norm": _norm_json(x.final_norm), "logits": logits,
        "sampling": sampling(x.logits, x.ids, x.position,
                             never_generated(model.tokenizer), settings, text),
    }


def _settings(body: dict, model: InferenceModel) -> dict[str, Any]:
    return {"temperature": _number(body, "temperature", 1.0, 0.0, 100.0),
            # (k past the vocabulary keeps every token, as in generation: the page sends 40)
            "top_k": _integer(body, "top_k", 0, 0, 2 ** 31 - 1),
            "top_p": _number(body, "top_p", 1.0, 1e-9, 1.0),
            "min_p": _number(body, "min_p", 0.0, 0.0, 1.0),
            "repetition_penalty": _number(body, "repetition_penalty", 1.0, 1e-3, 100.0),
            "seed": _integer(body, "seed", 0, 0, 2 ** 32 - 1)}


async def _prepare(body: dict, model: InferenceModel, text: Text) -> Computation:
    # (off the event loop: a chat template renders here, for up to its bound of seconds)
    ids, prompt_tokens = await asyncio.to_thread(request_ids, body, model)
    position = _integer(body, "position", len(ids) - 1, 0, len(ids) - 1)
    layer = _integer(body, "layer", 0, 0, model.config.model.n_layer - 1)
    settings = _settings(body, model)
    full_vocab = body.get("full_vocab", False)
    if type(full_vocab) is not bool:
        raise bad("full_vocab", f"'full_vocab' must be true or false, not {shown(full_vocab)}")

    def run(m: InferenceModel) -> dict[str, Any]:
        x = step_trace(m, ids, position, layer)
        if not np.isfinite(x.logits).all():
            raise ApiError(422, "the model's activations are not finite (NaN or infinite: "
                                "its weights overflow), so there is nothing to trace",
                           code="non_finite_logits")
        return to_json(x, m, settings, full_vocab, text, prompt_tokens)

    return run


ROUTES = [Route("/v1/trace", view_endpoint(_prepare), methods=["POST"])]
