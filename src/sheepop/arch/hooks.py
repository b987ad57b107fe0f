"""The named hook points of both engines, and the hooks of one forward pass (docs/hooks.md).

A hook point is a value the forward pass computes, under one name in both engines (the torch
engine's units: sheepop.model.hooks; the NumPy engine's: sheepop.scratch.hooks). B is the
batch, T the new positions, T_k the keys (cached and new), H the query heads, H_kv the
key/value heads of width d_k, d the model's width, d_ff the feed-forward's, V the vocabulary:

    embed                   h_0 = Drop(E[x] + P)                                 (B, T, d)
    blocks.l.resid_in       x_l = h_l (+ w_k h_s, the U-net's skip into block l)  (B, T, d)
    blocks.l.ln1            y = Norm1(x_l)                                       (B, T, d)
    blocks.l.attn.q_pre     y W_q^T + b_q, split into heads                      (B, H, T, d_k)
    blocks.l.attn.k_pre     y W_k^T + b_k, split into heads                   (B, H_kv, T, d_k)
    blocks.l.attn.q         q_pre after QK-norm and RoPE (what the scores read)  (B, H, T, d_k)
    blocks.l.attn.k         k_pre after QK-norm and RoPE                      (B, H_kv, T, d_k)
    blocks.l.attn.v         y W_v^T + b_v, then lam v + (1 - lam) T_j[x]      (B, H_kv, T, d_k)
    blocks.l.attn.scores    S = q K^T / sqrt(d_k), before the mask          (B, H, T, T_k)
    blocks.l.attn.pattern   A = softmax(S + M)                                  (B, H, T, T_k)
    blocks.l.attn.heads     o_h = A_h V_g(h), each head's output                (B, H, T, d_k)
    blocks.l.attn.out       a = [o_1 ... o_H] W_proj^T + b_proj                  (B, T, d)
    blocks.l.resid_mid      x1 = x_l + Drop(a)                                   (B, T, d)
    blocks.l.ln2            y2 = Norm2(x1)                                       (B, T, d)
    blocks.l.ffn.pre        u = y2 W_fc^T + b_fc (mlp); g = y2 W_gate^T + b_gate  (B, T, d_ff)
    blocks.l.ffn.up         swiglu only: y2 W_up^T + b_up                        (B, T, d_ff)
    blocks.l.ffn.hidden     phi(u) (mlp); silu(g) * up (swiglu): W_proj's input  (B, T, d_ff)
    blocks.l.ffn.out        f = hidden W_proj^T + b_proj                         (B, T, d)
    blocks.l.resid_out      h_(l+1) = x1 + Drop(f)                               (B, T, d)
    final_norm              Norm_f(h_L) (the last position only under last_only)  (B, T, d)
    logits                  z = Norm_f(h_L) W_head^T (+ b), then c tanh(z / c)   (B, T, V)

K and V in the scores and the pattern are every key the query sees (a KV cache's too); the
points k and v are the new positions' only. A hook is `hook(value, point)`: it returns None to
observe, or a value of the same shape that replaces the point for the rest of the pass. The
value is the engine's own (a torch tensor or a NumPy array): a hook that keeps it beyond the
pass copies it. This module is bookkeeping only: names, checks, and which hook runs where.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from sheepop.config.schema import ModelConfig

Hook = Callable[[Any, str], Any]
"""hook(value, point) -> None (observe) or the value that replaces the point."""

MODEL_POINTS = ("embed", "final_norm", "logits")
ATTENTION_POINTS = ("attn.q_pre", "attn.k_pre", "attn.q", "attn.k", "attn.v", "attn.scores",
                    "attn.pattern", "attn.heads", "attn.out")
EXPLICIT_POINTS = ("attn.scores", "attn.pattern")
"""Points only the explicit attention computes (a fused kernel never forms S or A)."""


def block_points(cfg: ModelConfig) -> tuple[str, ...]:
    """The points of one block, in the order the forward pass reaches them."""
    ffn = ("ffn.pre", "ffn.up") if cfg.ffn == "swiglu" else ("ffn.pre",)
    return ("resid_in", "ln1", *ATTENTION_POINTS, "resid_mid", "ln2", *ffn, "ffn.hidden",
            "ffn.out", "resid_out")


def point_names(cfg: ModelConfig) -> list[str]:
    """Every hook point of the model `cfg`, in the order the forward pass reaches them."""
    inner = block_points(cfg)
    return (["embed"] + [f"blocks.{i}.{p}" for i in range(cfg.n_layer) for p in inner]
            + ["final_norm", "logits"])


class Hooks:
    """The hooks of one forward pass, by point name, checked against the model's points."""

    def __init__(self, cfg: ModelConfig, hooks: Mapping[str, Hook]):
        known = set(point_names(cfg))
        unknown = sorted(set(hooks) - known)
        if unknown:
            raise ValueError(f"no hook point {unknown[0]!r} in this model (points: embed, "
                             f"blocks.0 .. blocks.{cfg.n_layer - 1} with "
                             f"{', '.join(block_points(cfg))}, final_norm, logits)")
        self.model = {p: hooks[p] for p in MODEL_POINTS if p in hooks}
        self.layers: list[dict[str, Hook]] = [{} for _ in range(cfg.n_layer)]
        for name, hook in hooks.items():
            if name.startswith("blocks."):
                _, layer, point = name.split(".", 2)
                self.layers[int(layer)][point] = hook
        self.explicit_attention = any(p in layer for layer in self.layers
                                      for p in EXPLICIT_POINTS)
        """Some hook reads the scores or the pattern: every layer then takes the explicit
        attention, so that the logits are the same whichever layers are hooked."""
        self.blocks = [LayerHooks(self, i) for i in range(cfg.n_layer)]
        self.replaced = 0
        """How many times a hook returned a value (replaced its point) so far: the NumPy
        engine's backward refuses a pass in which one did (sheepop.scratch.gpt.gpt_backward)."""

    def at(self, point: str, value: Any) -> Any:
        """The model-level `point` (embed, final_norm, logits) after its hook, if any."""
        hook = self.model.get(point)
        return value if hook is None else self._run(hook, value, point)

    def in_layer(self, layer: int, point: str, value: Any) -> Any:
        """Block `layer`'s `point` ("attn.q") after its hook, if any."""
        hook = self.layers[layer].get(point)
        return value if hook is None else self._run(hook, value, f"blocks.{layer}.{point}")

    def wants(self, layer: int, point: str) -> bool:
        return point in self.layers[layer]

    def _run(self, hook: Hook, value: Any, name: str) -> Any:
        out = hook(value, name)
        if out is None:
            return value
        if tuple(out.shape) != tuple(value.shape):
            raise ValueError(f"the hook at {name} returned shape {tuple(out.shape)}, not the "
                             f"point's {tuple(value.shape)}")
        self.replaced += 1
        return out


class LayerHooks:
    """One block's view of `Hooks`: its points by their short names ("attn.q")."""

    def __init__(self, hooks: Hooks, layer: int):
        self.hooks, self.layer = hooks, layer
        self.explicit_attention = hooks.explicit_attention

    def at(self, point: str, value: Any) -> Any:
        return self.hooks.in_layer(self.layer, point, value)

    def wants(self, point: str) -> bool:
        return self.hooks.wants(self.layer, point)
