"""One token through the model, step by step (the page's "Step" view; sheepop.arch.trace holds
what it gives): the NumPy engine's own forward pass over the prompt, read at its hook points
(sheepop.scratch.hooks; docs/hooks.md), at one position t and one layer l.

    h^(0)_t = E[x_t] + P[t]         embed; E[x_t] and P[t] apart: the table's row and the
                                    positions unit's own rows (RoPE and no positions: no P)
    h_in, x1, x2                    blocks.l.resid_in, resid_mid, resid_out
    Norm                            x from the stream, its statistics (Norm.moments), x_hat and
                                    y from the norm's own unit (sheepop.scratch.norm)
    q_pre, k_pre, q, k, v           blocks.l.attn.*: head h reads key/value head h // (H / H_kv)
    raw, weights, out               blocks.l.attn.scores (before the mask: every key), pattern,
                                    heads; allowed: the shared causal rule
    FFN                             blocks.l.ffn.pre, up, hidden, out; swiglu's silu(g) from
                                    the activation's unit
    ||h^(i)_t||                     embed, then every blocks.i.resid_out
    z_t                             Norm_f(h^(L)_t) W_head^T (+ b), then c tanh(z / c): the
                                    final norm's, the head's and the cap's units on row t alone
                                    (at 49k tokens the head over every row is a quarter of the
                                    pass)

The pass runs through a KV cache of its own, so no layer keeps its activations beyond its turn;
value embeddings, U-net skips, QK-norm and soft-capping are the engine's, so the trace follows
whatever the engine computes. Dropout is off (evaluation). Digit places, term indices and the
digit rotary kinds are refused (sheepop.arch.trace.check_traceable).
"""

from __future__ import annotations

import numpy as np

from sheepop.arch.batch import allowed_keys
from sheepop.arch.hooks import block_points
from sheepop.arch.trace import FFNStep, HeadStep, NormStep, TokenTrace, check_traceable
from sheepop.config.schema import ModelConfig
from sheepop.errors import UserError
from sheepop.scratch.gpt import gpt_forward, new_cache, token_tables
from sheepop.scratch.hooks import hooked
from sheepop.scratch.init import param_shapes
from sheepop.scratch.layers import linear_forward, silu_forward
from sheepop.scratch.norm import NORMS, norm_forward
from sheepop.scratch.positions import POSITIONS
from sheepop.scratch.softcap import softcap_forward

Weights = dict[str, np.ndarray]


def norm_step(kind: str, x: np.ndarray, w: Weights, prefix: str, eps: float) -> NormStep:
    """The norm `kind` at one row x (d,): its statistics and x_hat, y from its own unit."""
    y, cache = norm_forward(kind, x[None], w, prefix, eps)
    mean, var = NORMS[kind].moments(x[None])
    return NormStep(kind, x, None if mean is None else float(mean[0, 0]), float(var[0, 0]),
                    cache.xhat[0], y[0])


def _heads(seen: dict[str, np.ndarray], cfg: ModelConfig, t: int) -> list[HeadStep]:
    group = cfg.n_head // cfg.kv_heads
    allowed = allowed_keys(len(seen["attn.scores"][0, 0]), 0)[t]
    return [HeadStep(h // group, seen["attn.q_pre"][0, h, t], seen["attn.q"][0, h, t],
                     seen["attn.k_pre"][0, h // group, t], seen["attn.k"][0, h // group, t],
                     seen["attn.v"][0, h // group, t], seen["attn.scores"][0, h, t],
                     allowed, seen["attn.pattern"][0, h, t], seen["attn.heads"][0, h, t])
            for h in range(cfg.n_head)]


def _ffn(seen: dict[str, np.ndarray], cfg: ModelConfig, t: int) -> FFNStep:
    pre, hidden, out = (seen[f"ffn.{p}"][0, t] for p in ("pre", "hidden", "out"))
    if cfg.ffn == "swiglu":
        return FFNStep("swiglu", "silu", pre, hidden, seen["ffn.up"][0, t],
                       silu_forward(pre)[0], out)
    return FFNStep(cfg.ffn, cfg.activation, pre, hidden, None, None, out)


def trace_token(w: Weights, cfg: ModelConfig, ids: list[int], position: int, layer: int
                ) -> TokenTrace:
    """Every step of docs/math at `position` (0 .. T-1) and `layer` (0 .. L-1) of the prompt
    `ids` (at most block_size tokens), from the float32 weights `w` (the checkpoint's names)."""
    check_traceable(cfg)
    ids = [int(i) for i in ids]
    if not 1 <= len(ids) <= cfg.block_size:
        raise UserError(f"a prompt to trace holds 1 to {cfg.block_size} tokens, not {len(ids)}")
    if not 0 <= position < len(ids) or not 0 <= layer < cfg.n_layer:
        raise UserError(f"position {position} or layer {layer} is outside the prompt's "
                        f"{len(ids)} tokens or the model's {cfg.n_layer} layers")
    t, T = position, len(ids)
    w = {name: w[name] for name in param_shapes(cfg)}  # (a quantized layer's own arrays: not)
    seen: dict[str, np.ndarray] = {}
    rows: list[np.ndarray] = []  # h^(i)_t, i = 0 .. L

    def keep(x: np.ndarray, point: str) -> None:
        seen[point.removeprefix(f"blocks.{layer}.")] = x
        if point.endswith("resid_out"):
            rows.append(x[0, t])

    hooks = {f"blocks.{layer}.{p}": keep for p in block_points(cfg)}
    for point in ["embed"] + [f"blocks.{i}.resid_out" for i in range(cfg.n_layer) if i != layer]:
        hooks[point] = lambda h, point: rows.append(h[0, t])
    with np.errstate(over="ignore", invalid="ignore"):  # (the caller tests the logits)
        with hooked(cfg, hooks):
            gpt_forward(w, cfg, np.asarray([ids]), cache=new_cache(cfg, 1, T), last_only=True)
        return _trace(w, cfg, ids, t, layer, seen, rows)


def _trace(w: Weights, cfg: ModelConfig, ids: list[int], t: int, layer: int,
           seen: dict[str, np.ndarray], rows: list[np.ndarray]) -> TokenTrace:
    eps, T = cfg.ln_eps, len(ids)
    final = norm_step(cfg.norm, rows[-1], w, "ln_f.", eps)
    _, w_head, b_head = token_tables(w)
    z = softcap_forward(linear_forward(final.y, w_head, b_head)[0], cfg.logit_softcap)[0]
    embed = POSITIONS[cfg.pos_encoding].embed_forward
    positions = None if embed is None else embed(w, cfg, slice(0, T), np.float32)[0]
    heads = _heads(seen, cfg, t)
    prefix = f"blocks.{layer}."
    return TokenTrace(ids, t, layer, w["tok_emb.weight"][ids[t]],
                      None if positions is None else positions[t],
                      h_in=seen["resid_in"][0, t],
                      norm1=norm_step(cfg.norm, seen["resid_in"][0, t], w, prefix + "ln1.", eps),
                      heads=heads, concat=np.concatenate([h.out for h in heads]),
                      attn_out=seen["attn.out"][0, t], x1=seen["resid_mid"][0, t],
                      norm2=norm_step(cfg.norm, seen["resid_mid"][0, t], w, prefix + "ln2.",
                                      eps),
                      ffn=_ffn(seen, cfg, t), x2=seen["resid_out"][0, t],
                      stream_norms=[float(np.linalg.norm(h)) for h in rows],
                      final_norm=final, logits=z)
