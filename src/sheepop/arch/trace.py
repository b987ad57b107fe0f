"""One token through the model, step by step, in the notation of docs/math (the page's "Step"
view): every intermediate vector at one position t and one layer l, computed here in NumPy from
the weights alone (engine-independent: the engines' own forward passes are not read).

    h^(0)_t    = E[x_t] + P[t]                         (02-embedding, 03-positions; RoPE: no P)
    Norm       LayerNorm: mu = mean(x), sigma^2 = mean((x - mu)^2),
               x_hat = (x - mu) / sqrt(sigma^2 + eps), y = gamma * x_hat + beta
               RMSNorm:   ms = mean(x^2), x_hat = x / sqrt(ms + eps), y = gamma * x_hat
                                                                               (06-layernorm)
    [q; k; v]  = y W_qkv^T + b_qkv, split into H query heads and H_kv key/value heads of d_k
               RoPE turns each pair (2i, 2i+1) of q and k by t * theta^(-2i/d_k)  (04, 03)
               value embeddings: v <- lam v + (1 - lam) T_j[x_t]  (value-embeddings.md)
    S_t        = q_t K^T / sqrt(d_k) + M_t,  M_t[j] = -inf for j > t           (04-attention)
    A_t        = softmax(S_t),  o_t = A_t V      (head h reads key/value head h // (H / H_kv))
    a_t        = [o^1_t ... o^H_t] W_proj^T + b_proj;  x1_t = h_t + a_t        (04, 07)
    FFN        mlp: u = y W_fc^T + b_fc, phi(u), f = phi(u) W_proj^T + b_proj
               swiglu: g = y W_gate^T, u = y W_up^T, silu(g) * u, then W_proj  (05-feed-forward)
    x2_t       = x1_t + f_t = h^(l+1)_t                                       (07-transformer)
               U-net skips: block i's input gains w_k h^(s+1), s = L-1-i   (skip-connections.md)
    z_t        = Norm_f(h^(L)_t) W_head^T (+ b_head), then c tanh(z_t / c)    (07.3)

The whole prompt runs through every layer (the keys and values of the other positions are
needed), in float32 as the engines compute; only the chosen position and layer are kept, with
the norm of the residual stream at t before and after every block, and the logits z_t (the
head for position t alone: at 49k tokens it would be a quarter of the work for all of them).
Dropout is off (evaluation). Digit places, term indices and the digit rotary kinds are refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sheepop.arch.links import SKIP_WEIGHTS, VALUE_LAMBDAS, VALUE_TABLE, skip_links, value_links
from sheepop.config.schema import ModelConfig
from sheepop.errors import UserError
from sheepop.positional import rope_frequencies, sinusoidal_table
from sheepop.softmax import softmax

Weights = dict[str, np.ndarray]
TRACED_POSITIONS = ("sinusoidal", "learned", "rope", "none")


@dataclass
class NormStep:
    """One norm at one position: its input x, its statistics, x_hat and its output y."""
    kind: str                   # layernorm | rmsnorm
    x: np.ndarray
    mean: float | None          # mu (layernorm)
    var: float                  # sigma^2 (layernorm) or the mean square (rmsnorm)
    x_hat: np.ndarray
    y: np.ndarray


@dataclass
class HeadStep:
    """Query head h at position t: q (before and after RoPE), its key/value head's k_t and v_t,
    the scores over every key (the masked ones too), the weights and the weighted sum."""
    kv_head: int
    q_pre: np.ndarray
    q: np.ndarray
    k_pre: np.ndarray
    k: np.ndarray
    v: np.ndarray
    raw: np.ndarray              # q_t k_j / sqrt(d_k) for every key j (T,)
    allowed: np.ndarray          # M_t[j] = 0 where True, -inf elsewhere (T,) bool
    weights: np.ndarray          # A_t = softmax(S_t) (T,), 0 on masked keys
    out: np.ndarray              # o_t = A_t V (d_k,)


@dataclass
class FFNStep:
    kind: str                    # mlp | swiglu
    activation: str              # phi (mlp) or silu (swiglu)
    pre: np.ndarray              # u = y W_fc^T + b (mlp); g = y W_gate^T + b (swiglu)
    act: np.ndarray              # phi(u); silu(g) * up (swiglu)
    up: np.ndarray | None        # swiglu: y W_up^T + b
    gate_act: np.ndarray | None  # swiglu: silu(g)
    out: np.ndarray              # f_t


@dataclass
class TokenTrace:
    ids: list[int]
    position: int
    layer: int
    token: np.ndarray            # E[x_t]
    pos_term: np.ndarray | None  # P[t] (None: RoPE or no positions)
    h_in: np.ndarray             # h^(l)_t, the block's input
    norm1: NormStep
    heads: list[HeadStep]
    concat: np.ndarray           # [o^1_t ... o^H_t]
    attn_out: np.ndarray         # a_t
    x1: np.ndarray
    norm2: NormStep
    ffn: FFNStep
    x2: np.ndarray               # h^(l+1)_t
    stream_norms: list[float]    # ||h^(i)_t||, i = 0 .. L
    final_norm: NormStep
    logits: np.ndarray           # z_t (V,)


def check_traceable(cfg: ModelConfig) -> None:
    """One UserError line for the model kinds this trace does not follow."""
    if cfg.pos_encoding not in TRACED_POSITIONS:
        raise UserError(f"the step-by-step trace follows {', '.join(TRACED_POSITIONS)} "
                        f"positions, not '{cfg.pos_encoding}'")
    if cfg.digit_positions or cfg.term_positions:
        raise UserError("the step-by-step trace does not follow digit places or term indices "
                        "(model.digit_positions, model.term_positions)")


def _norm(kind: str, x: np.ndarray, w: Weights, prefix: str, eps: float
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """(y, x_hat, var or mean square, mean) of every row of x (docs/math/06-layernorm.md).
    A mean square is x . x / d, one dot product a row, as the NumPy engine computes it
    (sheepop.scratch.norm.mean_square), and x_hat = x * (1 / sqrt(.)) as the engine forms it:
    the trace's norms are the engine's to the last bit."""
    d = x.shape[-1]
    if kind == "layernorm":
        mu = x.sum(axis=-1, keepdims=True) / d
        xc = x - mu
        var = np.vecdot(xc, xc)[..., None] / d
        x_hat = xc * (1.0 / np.sqrt(var + eps))
        return x_hat * w[prefix + "weight"] + w[prefix + "bias"], x_hat, var, mu
    ms = np.vecdot(x, x)[..., None] / d
    x_hat = x * (1.0 / np.sqrt(ms + eps))
    return x_hat * w[prefix + "weight"], x_hat, ms, None


def _norm_step(kind: str, x: np.ndarray, w: Weights, prefix: str, eps: float, t: int
               ) -> tuple[np.ndarray, NormStep]:
    y, x_hat, var, mu = _norm(kind, x, w, prefix, eps)
    return y, NormStep(kind, x[t].copy(), None if mu is None else float(mu[t, 0]),
                       float(var[t, 0]), x_hat[t], y[t])


def _linear(x: np.ndarray, w: Weights, name: str) -> np.ndarray:
    """y = x W^T + b (b when the model has it)."""
    y = x @ w[name + ".weight"].T
    bias = w.get(name + ".bias")
    return y if bias is None else y + bias


def activation(name: str, u: np.ndarray) -> np.ndarray:
    """phi(u) (docs/math/05-feed-forward.md): GELU exact x Phi(x) with Phi(x) = (1 + erf(x /
    sqrt 2)) / 2, GELU-tanh, ReLU, ReLU^2 max(x, 0)^2, SiLU x sigmoid(x)."""
    if name == "gelu":
        erf = np.frompyfunc(math.erf, 1, 1)
        cdf = 0.5 * (1.0 + erf(u.astype(np.float64) / math.sqrt(2.0)).astype(np.float64))
        return (u * cdf).astype(u.dtype)
    if name == "gelu_tanh":
        c = math.sqrt(2.0 / math.pi)
        return 0.5 * u * (1.0 + np.tanh(c * (u + 0.044715 * u ** 3)))
    if name == "relu":
        return np.maximum(u, 0)
    if name == "relu2":
        return np.square(np.maximum(u, 0))
    if name == "silu":
        with np.errstate(over="ignore"):  # e^-u = inf below u ~ -88: sigmoid 0, its limit
            return u * (1.0 / (1.0 + np.exp(-u)))
    raise UserError(f"the step-by-step trace does not know the activation '{name}'")


def _rotate(x: np.ndarray, angles: np.ndarray) -> np.ndarray:
    """RoPE on (heads, T, d_k): pair (2i, 2i+1) at position p turned by angles[p, i]
    (docs/math/03-positions.md, "Rotary positions")."""
    cos, sin = np.cos(angles).astype(x.dtype), np.sin(angles).astype(x.dtype)
    even, odd = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = even * sin + odd * cos
    return out


def _attention(y: np.ndarray, w: Weights, prefix: str, cfg: ModelConfig, t: int | None,
               values: tuple[np.ndarray, np.ndarray] | None = None
               ) -> tuple[np.ndarray, list[HeadStep]]:
    """The attention's output a (T, d) and, at position t, each head's `HeadStep`; `values`
    (the rows T_j[x] (T, H_kv d_k), lam) mixed into the values (model.value_embeds)."""
    T, H, Hkv, dk = y.shape[0], cfg.n_head, cfg.kv_heads, cfg.head_dim
    qkv = _linear(y, w, prefix + "attn.qkv").reshape(T, H + 2 * Hkv, dk).transpose(1, 0, 2)
    q_pre, k_pre, v = qkv[:H], qkv[H:H + Hkv], qkv[H + Hkv:]
    if values is not None:  # v <- lam v + (1 - lam) T_j[x] (sheepop.scratch.value_embeds)
        rows, lam = values
        v = lam * v + (1 - lam) * rows.reshape(T, Hkv, dk).transpose(1, 0, 2)
    q, k = q_pre, k_pre
    if cfg.qk_norm:  # each head's vector over d_k RMS-normalised, no gain (scratch/qk_norm.py)
        q, k = (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + cfg.ln_eps) for x in (q, k))
    if cfg.pos_encoding == "rope":
        angles = np.arange(T, dtype=np.float64)[:, None] * rope_frequencies(dk, cfg.rope_theta)
        q, k = _rotate(q, angles), _rotate(k, angles)
    group = H // Hkv
    kv = np.arange(H) // group                              # the key/value head of each head
    allowed = np.tril(np.ones((T, T), dtype=bool))          # M = 0 on and below the diagonal
    raw = q @ k[kv].transpose(0, 2, 1) / np.float32(math.sqrt(dk))   # (H, T, T)
    a = softmax(np.where(allowed, raw, -np.inf))
    o = a @ v[kv]                                            # (H, T, d_k)
    concat = o.transpose(1, 0, 2).reshape(T, H * dk)
    out = _linear(concat, w, prefix + "attn.proj")
    if t is None:
        return out, []
    heads = [HeadStep(int(kv[h]), q_pre[h, t], q[h, t], k_pre[kv[h], t], k[kv[h], t],
                      v[kv[h], t], raw[h, t], allowed[t], a[h, t], o[h, t]) for h in range(H)]
    return out, heads


def _ffn(y: np.ndarray, w: Weights, prefix: str, cfg: ModelConfig, t: int
         ) -> tuple[np.ndarray, FFNStep]:
    if cfg.ffn == "swiglu":
        g, up = _linear(y, w, prefix + "ffn.gate"), _linear(y, w, prefix + "ffn.up")
        gate = activation("silu", g)
        hidden = gate * up
        out = _linear(hidden, w, prefix + "ffn.proj")
        return out, FFNStep("swiglu", "silu", g[t], hidden[t], up[t], gate[t], out[t])
    u = _linear(y, w, prefix + "ffn.fc")
    hidden = activation(cfg.activation, u)
    out = _linear(hidden, w, prefix + "ffn.proj")
    return out, FFNStep("mlp", cfg.activation, u[t], hidden[t], None, None, out[t])


def embed(w: Weights, cfg: ModelConfig, ids: list[int]) -> tuple[np.ndarray, np.ndarray | None]:
    """(E[x], P[0:T]) for the prompt: P the scaled sinusoidal table s P or the learned rows;
    None for RoPE and no positions."""
    T = len(ids)
    tokens = w["tok_emb.weight"][np.asarray(ids)]
    if cfg.pos_encoding == "sinusoidal":
        table = sinusoidal_table(T, cfg.n_embd) * cfg.sinusoid_scale
        return tokens, table.astype(tokens.dtype)
    if cfg.pos_encoding == "learned":
        return tokens, w["pos_emb.weight"][:T]
    return tokens, None


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
    tokens, positions = embed(w, cfg, ids)
    h = tokens if positions is None else tokens + positions
    t, eps, kept = position, cfg.ln_eps, {}
    norms = [float(np.linalg.norm(h[t]))]
    skips, outputs = skip_links(cfg), []
    for i, link in enumerate(value_links(cfg)):
        prefix, here = f"blocks.{i}.", i == layer
        if skips[i] is not None:  # the U-net's skip into block i (sheepop.scratch.skips)
            h = h + w[SKIP_WEIGHTS][skips[i].weight] * outputs[skips[i].source]
        values = None if link is None else (w[VALUE_TABLE.format(link.table)][np.asarray(ids)],
                                            w[VALUE_LAMBDAS][link.mix])
        y1, norm1 = _norm_step(cfg.norm, h, w, prefix + "ln1.", eps, t)
        a, heads = _attention(y1, w, prefix, cfg, t if here else None, values)
        x1 = h + a
        y2, norm2 = _norm_step(cfg.norm, x1, w, prefix + "ln2.", eps, t)
        f, ffn = _ffn(y2, w, prefix, cfg, t)
        x2 = x1 + f
        if here:
            kept = dict(h_in=h[t], norm1=norm1, heads=heads, attn_out=a[t], x1=x1[t],
                        norm2=norm2, ffn=ffn, x2=x2[t],
                        concat=np.concatenate([s.out for s in heads]))
        h = x2
        outputs.append(h)
        norms.append(float(np.linalg.norm(h[t])))
    hf, final = _norm_step(cfg.norm, h, w, "ln_f.", eps, t)
    head = w.get("head.weight", w["tok_emb.weight"])
    z = hf[t] @ head.T  # only position t: at 49k tokens the head is a quarter of the work
    if "head.bias" in w:
        z = z + w["head.bias"]
    if cfg.logit_softcap:  # c tanh(z / c) (sheepop.scratch.softcap)
        z = cfg.logit_softcap * np.tanh(z / cfg.logit_softcap)
    return TokenTrace(ids, t, layer, tokens[t], None if positions is None else positions[t],
                      stream_norms=norms, final_norm=final, logits=z, **kept)
