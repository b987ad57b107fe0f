"""Recomputing the worked examples of docs/architectures.md: rotary positions (one rotation, the
relative property, Hugging Face's layout, the sliding window past the context), RMSNorm's
backward, SiLU and SwiGLU, the SwiGLU width rule, grouped-query attention and its KV cache.
Where both engines compute a formula, both run and must agree; the scratch engine's (float64)
values are the ones compared with the page."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
import torch.nn.functional as F

from sheepop.arch.batch import allowed_keys
from sheepop.config.build import build_config
from sheepop.config.layer_kinds import default_ffn_width
from sheepop.config.model_size import kv_cache_bytes_per_token, param_count
from sheepop.config.schema import ModelConfig
from sheepop.model import ffn as torch_ffn
from sheepop.model import gpt as torch_gpt
from sheepop.model import positions as torch_positions
from sheepop.positional import rope_frequencies
from sheepop.scratch import attention as att
from sheepop.scratch import layers as L
from sheepop.scratch import rope
from sheepop.scratch.ffn import swiglu_backward, swiglu_forward
from sheepop.scratch.gpt import new_cache
from sheepop.scratch.init import param_shapes
from sheepop.scratch.lm import NumpyLM
from sheepop.scratch.norm import rmsnorm_backward, rmsnorm_forward


def f64(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


def t64(a) -> torch.Tensor:
    return torch.tensor(f64(a))


def close(a, b, tol: float = 1e-12) -> None:
    a = a.detach().numpy() if hasattr(a, "detach") else np.asarray(a)
    np.testing.assert_allclose(a, np.asarray(b), rtol=tol, atol=tol)


def rotate(x: np.ndarray, pos: int, theta: float) -> np.ndarray:
    """Scratch RoPE of one head vector (d_k,) at position `pos`, in float64."""
    angles = rope.rope_angles(slice(pos, pos + 1), len(x), theta, np.float64)
    return rope.rope_forward(x[None, None, None, :], angles)[0, 0, 0]


def rope_rotation(v):
    x, pos, theta = f64(v["x"]), int(v["pos"]), float(v["theta"])
    angles = rope.rope_angles(slice(pos, pos + 1), len(x), theta, np.float64)
    y = rotate(x, pos, theta)
    cfg = ModelConfig(n_embd=len(x), n_head=1, pos_encoding="rope", rope_theta=theta)
    q = t64(x)[None, None, None, :].float()
    turned = torch_positions.RotaryPositions(cfg).rotate(q, slice(pos, pos + 1))  # torch
    close(turned[0, 0, 0], y, 1e-6)  # (float32 angles)
    back = rope.rope_backward(y[None, None, None, :], angles)[0, 0, 0]
    omega = rope_frequencies(len(x), theta)
    return {"omega": omega, "angle": pos * omega,
            "cos": angles.cos[0], "sin": angles.sin[0], "rotated": y,
            "norm_squared": x @ x, "rotated_norm_squared": y @ y, "rope_backward_of_rotated": back}


def rope_relative(v):
    q, k, theta = f64(v["q"]), f64(v["k"]), float(v["theta"])
    m, n, s = int(v["m"]), int(v["n"]), int(v["shift"])
    dot = rotate(q, m, theta) @ rotate(k, n, theta)
    shifted = rotate(q, m + s, theta) @ rotate(k, n + s, theta)
    offset = q @ rotate(k, n - m, theta)  # q^T R((n - m) omega) k
    return {"dot_unrotated": q @ k, "dot_at_m_n": dot, "dot_shifted": shifted,
            "dot_from_offset": offset,
            "agree_to_1e_12": bool(abs(dot - shifted) < 1e-12 and abs(dot - offset) < 1e-12)}


def rope_hf_layout(v):
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    x, pos, theta = f64(v["x"]), int(v["pos"]), float(v["theta"])
    dk = len(x)
    perm = np.concatenate([np.arange(0, dk, 2), np.arange(1, dk, 2)])
    angle = pos * rope_frequencies(dk, theta)
    cos, sin = (t64(np.concatenate([f(angle), f(angle)]))[None, None] for f in (np.cos, np.sin))
    hf = t64(x[perm])[None, None, None, :]
    hf_rotated, _ = apply_rotary_pos_emb(hf, hf, cos, sin)  # transformers' rotate-half
    return {"perm": perm, "x_hf": x[perm], "hf_rotated": hf_rotated[0, 0, 0],
            "sheepop_rotated_then_permuted": rotate(x, pos, theta)[perm]}


def sliding_window(v):
    T, n = int(v["block_size"]), int(v["length"])
    cfg = ModelConfig(vocab_size=7, n_embd=8, n_head=2, n_kv_head=1, n_layer=2, block_size=T,
                      pos_encoding="rope", norm="rmsnorm", ffn="swiglu", d_ff=16, bias=False,
                      tie_weights=False)
    rng = np.random.default_rng(0)
    weights = {name: rng.normal(0, 0.5, shape) for name, shape in param_shapes(cfg).items()}
    lm = NumpyLM(cfg, weights, dtype=np.float64)
    ids = [int(t) for t in rng.integers(0, cfg.vocab_size, n)]
    cached, columns = [lm.prefill(ids[:T])], []
    for t in ids[T:]:  # past the context: each token overwrites the ring's oldest column
        columns.append(lm.cache.column())
        cached.append(lm.decode(t))
    uncached = [lm.full(ids[:i]) for i in range(T, n + 1)]  # what --no-cache computes
    allowed = allowed_keys(n, 0, window=T)
    return {"allowed": allowed.astype(int), "last_query_sees": np.flatnonzero(allowed[-1]),
            "decode_columns": columns,
            "cached_equals_uncached": bool(np.allclose(cached, uncached, rtol=0, atol=1e-12))}


def rmsnorm_gradient(v):
    x, gamma, eps, dy = f64(v["x"]), f64(v["gamma"]), float(v["eps"]), f64(v["dy"])
    y, cache = rmsnorm_forward(x.copy(), gamma, eps)  # scratch
    dx, dgamma = rmsnorm_backward(dy, cache)
    xt = t64(x).requires_grad_()  # torch autograd through nn.RMSNorm (model.norm = rmsnorm)
    norm = torch.nn.RMSNorm(x.shape[1], eps=eps).double()
    with torch.no_grad():
        norm.weight.copy_(t64(gamma))
    (norm(xt) * t64(dy)).sum().backward()
    close(xt.grad, dx)
    close(norm.weight.grad, dgamma)
    g = dy * gamma
    return {"mean_square": (x * x).mean(1), "rstd": cache.rstd[:, 0], "xhat": cache.xhat, "y": y,
            "g": g, "mean_g_xhat": (g * cache.xhat).mean(1), "dx": dx, "dgamma": dgamma,
            "xhat_dot_dx": (cache.xhat * dx).sum(1)}


def silu(v):
    x = f64(v["x"])
    y, cache = L.silu_forward(x)  # scratch
    grad = L.silu_backward(np.ones_like(x), cache)
    xt = t64(x).requires_grad_()
    F.silu(xt).sum().backward()  # torch
    close(F.silu(t64(x)), y)
    close(xt.grad, grad)
    return {"sigmoid": L.sigmoid(x), "silu": y, "silu_grad": grad}


def swiglu(v):
    x = f64(v["x"])[None]
    w_gate, w_up, w_proj, dout = (f64(v[k]) for k in ("w_gate", "w_up", "w_proj", "dout"))
    out, cache = swiglu_forward(x, w_gate, None, w_up, None, w_proj, None)  # scratch
    dx, grads = swiglu_backward(dout[None], cache)
    module = torch_ffn.SwiGLU(ModelConfig(n_embd=x.shape[-1], d_ff=w_gate.shape[0], ffn="swiglu",
                                          bias=False)).double()  # torch, with autograd
    with torch.no_grad():
        for name, w in (("gate", w_gate), ("up", w_up), ("proj", w_proj)):
            module.get_parameter(f"{name}.weight").copy_(t64(w))
    xt = t64(x).requires_grad_()
    y = module(xt)
    (y * t64(dout)[None]).sum().backward()
    close(y, out)
    close(xt.grad, dx)
    for name in ("gate", "up", "proj"):
        close(module.get_parameter(f"{name}.weight").grad, grads[f"{name}.weight"])
    g, u, a = cache.gate.x @ w_gate.T, cache.u, cache.a
    dh = dout @ w_proj
    return {"g": g[0], "u": u[0], "a": a[0], "h": (a * u)[0], "out": out[0], "dh": dh,
            "da": dh * u[0], "du": dh * a[0], "dg": L.silu_backward(dh * u[0], cache.silu)[0],
            "dx": dx[0], "dw_gate": grads["gate.weight"], "dw_up": grads["up.weight"],
            "dw_proj": grads["proj.weight"]}


def swiglu_width(v):
    d = [int(x) for x in v["d"]]
    f_mlp = [default_ffn_width("mlp", x) for x in d]
    f_swiglu = [default_ffn_width("swiglu", x) for x in d]
    for x, f in zip(d, f_swiglu):
        assert ModelConfig(n_embd=x, ffn="swiglu").ffn_dim == f
    return {"eight_d_over_3": [8 * x / 3 for x in d], "f_mlp": f_mlp, "f_swiglu": f_swiglu,
            "mlp_matrix_params": [2 * x * f for x, f in zip(d, f_mlp)],
            "swiglu_matrix_params": [3 * x * f for x, f in zip(d, f_swiglu)]}


def layer_costs(v):
    out: dict[str, list] = {}
    for preset in v["presets"]:
        cfg = dataclasses.replace(build_config(preset).model, vocab_size=int(v["vocab_size"]))
        shapes = {k: int(np.prod(s)) for k, s in param_shapes(cfg).items()}  # scratch
        total = sum(shapes.values())
        assert total == torch_gpt.GPT(cfg).num_params() == param_count(cfg)  # torch, size rule
        part = {"attention_per_block": ".attn.", "ffn_per_block": ".ffn.",
                "norms_per_block": ".ln"}
        for key, marker in part.items():
            n = sum(s for k, s in shapes.items() if k.startswith("blocks.0.") and marker in k)
            out.setdefault(key, []).append(n)
        outside = sum(s for k, s in shapes.items() if not k.startswith("blocks."))
        out.setdefault("outside_blocks", []).append(outside)
        out.setdefault("total", []).append(total)
    return out


def gqa_grouping(v):
    H, H_kv = int(v["n_head"]), int(v["n_kv_head"])
    which = att.repeat_kv_forward(np.arange(H_kv, dtype=float).reshape(1, H_kv, 1, 1), H // H_kv)
    dk = f64(v["dk_query_heads"]).reshape(1, H, 1, 1)
    summed = att.repeat_kv_backward(dk, H // H_kv)  # scratch
    kt = torch.zeros(1, H_kv, 1, 1, dtype=torch.float64, requires_grad=True)
    (kt.repeat_interleave(H // H_kv, dim=1) * t64(dk)).sum().backward()  # torch's repeat
    close(kt.grad, summed)
    return {"group_size": H // H_kv, "kv_head_of_query": which.reshape(-1).astype(int),
            "dk_kv_heads": summed.reshape(-1)}


def gqa_cache(v):
    out: dict[str, list] = {}
    for preset in v["presets"]:
        cfg = build_config(preset).model
        cache = new_cache(cfg, 1, dtype=np.float32)  # as the scratch engine allocates it,
        cache.reserve(cfg.block_size)  # grown to the whole context
        full = cache.k.nbytes + cache.v.nbytes
        assert full == cfg.block_size * kv_cache_bytes_per_token(cfg)
        for key, value in (("n_layer", cfg.n_layer), ("n_head", cfg.n_head),
                           ("kv_heads", cfg.kv_heads), ("head_dim", cfg.head_dim),
                           ("bytes_per_token", kv_cache_bytes_per_token(cfg)),
                           ("block_size", cfg.block_size), ("bytes_full_context", full),
                           ("mib_full_context", full / 2**20)):
            out.setdefault(key, []).append(value)
    return out


CHECKS = {
    "rope_rotation": (("x", "pos", "theta"), rope_rotation),
    "rope_relative": (("q", "k", "theta", "m", "n", "shift"), rope_relative),
    "rope_hf_layout": (("x", "pos", "theta"), rope_hf_layout),
    "sliding_window": (("block_size", "length"), sliding_window),
    "rmsnorm_gradient": (("x", "gamma", "eps", "dy"), rmsnorm_gradient),
    "silu": (("x",), silu),
    "swiglu": (("x", "w_gate", "w_up", "w_proj", "dout"), swiglu),
    "swiglu_width": (("d",), swiglu_width),
    "layer_costs": (("presets", "vocab_size"), layer_costs),
    "gqa_grouping": (("n_head", "n_kv_head", "dk_query_heads"), gqa_grouping),
    "gqa_cache": (("presets",), gqa_cache),
}
