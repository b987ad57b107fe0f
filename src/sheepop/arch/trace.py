"""One token through the model, step by step, in the notation of docs/math (the page's "Step"
view): what it shows at one position t and one layer l. The engine computes it, read at its hook
points (sheepop.scratch.token_steps; docs/hooks.md); this module holds only its shape.

    h^(0)_t    = E[x_t] + P[t]                         (02-embedding, 03-positions; RoPE: no P)
    Norm       x, its mean mu (LayerNorm) and variance or mean square, x_hat, y  (06-layernorm)
    [q; k; v]  = y W_qkv^T + b_qkv, split into H query heads and H_kv key/value heads of d_k;
               q, k after QK-norm and RoPE, v after the value embeddings' mix      (04, 03)
    S_t        = q_t K^T / sqrt(d_k) + M_t,  M_t[j] = -inf for j > t           (04-attention)
    A_t        = softmax(S_t),  o_t = A_t V      (head h reads key/value head h // (H / H_kv))
    a_t        = [o^1_t ... o^H_t] W_proj^T + b_proj;  x1_t = h_t + a_t        (04, 07)
    FFN        mlp: u, phi(u), f; swiglu: g, up, silu(g), silu(g) * up, f    (05-feed-forward)
    x2_t       = x1_t + f_t = h^(l+1)_t                                       (07-transformer)
    z_t        = Norm_f(h^(L)_t) W_head^T (+ b_head), then c tanh(z_t / c)    (07.3)

with the norm of the residual stream at t before and after every block.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sheepop.config.schema import ModelConfig
from sheepop.errors import UserError

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
