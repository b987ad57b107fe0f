"""LoRA in the NumPy engine: one unit that wraps the plain model (docs/derivations/lora.md).

An adapted linear layer y = x W^T + b + s (x A^T) B^T, A (r, in), B (out, r), s = alpha / r,
is the plain layer run on the effective weight

    W' = W + s B A                                            (out, in)

so the model is never told: `lora_forward` builds W' for every adapted layer (and, with
`lora.new_tokens` = n, the grown tables E' = [E[:V-n]; R], sheepop.arch.lora), runs the plain
`gpt_forward` on them, and `lora_backward` runs the plain `gpt_backward` and turns its dW'
into the adapters' gradients. With G = dL/dW' (out, in), each entry W'_ij = W_ij +
s sum_k B_ik A_kj, so by the chain rule

    dL/dB_ik = sum_j G_ij dW'_ij/dB_ik = s sum_j G_ij A_kj     dB = s G A^T      (out, r)
    dL/dA_kj = sum_i G_ij dW'_ij/dA_kj = s sum_i B_ik G_ij     dA = s B^T G      (r, in)

and a trained row R_t of a grown table is row V-n+t of that table, so dR = dE'[V-n:] (for a
tied head, dE' already holds the head's dW: the plain backward adds the two). Every other
gradient (W, b, norms, positions, the first V-n rows) belongs to a frozen weight and is
dropped. dx is the plain layer's, dy W': the sum of the base path's dy W and the adapter's
s dy B A, as the low-rank form's.

The cost (docs/architecture.md gives the measured step times): forming W' is out*in*r
multiply-adds per layer, and the plain backward computes every dW' (N*in*out, N the rows of
the batch) where the low-rank form needed only N*r*(in+out); the frozen weights' gradients are
computed and dropped. In exchange the model's layers take weights only.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from sheepop.arch.lora import (
    NEW_ROWS,
    LoraConfig,
    adapter_shapes,
    check_adapters,
    init_adapters,
    is_adapter,
    with_new_rows,
)
from sheepop.config.schema import ModelConfig
from sheepop.scratch.gpt import GPT, GPTCache, deliver, gpt_backward, gpt_forward
from sheepop.scratch.layers import LinearCache, linear_backward, linear_forward

Params = dict[str, np.ndarray]


class Adapter(NamedTuple):
    """A layer's adapter: W' = W + scale B A, A (r, in), B (out, r). `FROZEN` (a and b None):
    a frozen layer without one."""
    a: np.ndarray | None
    b: np.ndarray | None
    scale: float = 0.0


FROZEN = Adapter(None, None)


def adapted_weight(w: np.ndarray, adapter: Adapter) -> np.ndarray:
    """W' = W + s B A, in W's dtype (W itself, untouched, for FROZEN)."""
    if adapter.a is None:
        return w
    update = adapter.b @ adapter.a
    update *= update.dtype.type(adapter.scale)
    return w + update.astype(w.dtype, copy=False)


def adapter_grads(dw: np.ndarray, adapter: Adapter) -> tuple[np.ndarray, np.ndarray]:
    """(dA, dB) = (s B^T G, s G A^T) from G = dL/dW' (the derivation at the top)."""
    s = dw.dtype.type(adapter.scale)
    return (adapter.b.T @ dw) * s, (dw @ adapter.a.T) * s


# ----- one layer ---------------------------------------------------------------------------

class LoraLinearCache(NamedTuple):
    plain: LinearCache
    adapter: Adapter


def lora_linear_forward(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, adapter: Adapter
                        ) -> tuple[np.ndarray, LoraLinearCache]:
    """y = x W'^T + b, W' = W + s B A: a frozen linear layer with its adapter (or FROZEN)."""
    y, cache = linear_forward(x, adapted_weight(w, adapter), b)
    return y, LoraLinearCache(cache, adapter)


def lora_linear_grads(dout: np.ndarray, cache: LoraLinearCache, name: str
                      ) -> tuple[np.ndarray, dict[str, np.ndarray | None]]:
    """dx = dy W', and the gradients `{name}.weight` and `{name}.bias`, None (frozen), and,
    with an adapter, `{name}.lora_A` and `{name}.lora_B` (`adapter_grads` of dW')."""
    dx, dw, _ = linear_backward(dout, cache.plain)
    grads: dict[str, np.ndarray | None] = {f"{name}.weight": None, f"{name}.bias": None}
    if cache.adapter.a is not None:
        grads[f"{name}.lora_A"], grads[f"{name}.lora_B"] = adapter_grads(dw, cache.adapter)
    return dx, grads


# ----- the whole model -----------------------------------------------------------------------

class LoraCache(NamedTuple):
    core: GPTCache
    adapters: dict[str, Adapter]  # by layer prefix ("blocks.0.attn.qkv")
    rows: dict[str, str]          # a trained rows' name -> the table it grows
    new_tokens: int


def effective_weights(params: Params, lora: LoraConfig
                      ) -> tuple[Params, dict[str, Adapter], dict[str, str]]:
    """The plain model's parameters from base weights and adapters (one dict, the checkpoint's
    names): W' = W + s B A for each adapted layer, E' = [E[:V-n]; R] for each grown table,
    every other weight as it is; and the adapters by layer prefix, the rows by name."""
    plain = {name: w for name, w in params.items() if not is_adapter(name)}
    adapters = {}
    for name in params:
        if name.endswith(".lora_A"):
            prefix = name[:-len(".lora_A")]
            adapters[prefix] = Adapter(params[name], params[prefix + ".lora_B"], lora.scale)
            plain[prefix + ".weight"] = adapted_weight(plain[prefix + ".weight"],
                                                       adapters[prefix])
    rows = {name: table for name, table in NEW_ROWS.items() if name in params}
    for name, table in rows.items():
        plain[table] = with_new_rows(plain[table], params[name])
    return plain, adapters, rows


def lora_forward(params: Params, cfg: ModelConfig, idx: np.ndarray,
                 targets: np.ndarray | None = None, rng: np.random.Generator | None = None,
                 lora: LoraConfig | None = None, **options
                 ) -> tuple[np.ndarray, float | None, LoraCache]:
    """`gpt_forward` of the adapted model: `params` holds the base weights and the adapters
    (and new tokens' rows) of `lora`; `options` go to gpt_forward (cache, last_only, ...)."""
    if lora is None:
        raise ValueError("lora_forward needs the adapters' LoraConfig")
    plain, adapters, rows = effective_weights(params, lora)
    logits, loss, core = gpt_forward(plain, cfg, idx, targets, rng, **options)
    return logits, loss, LoraCache(core, adapters, rows, lora.new_tokens)


def lora_backward(cache: LoraCache, grads: Params | None = None, dloss: float = 1.0,
                  dlogits: np.ndarray | None = None) -> Params:
    """The adapters' gradients (dA, dB of each adapted layer, dR of each grown table) from the
    plain backward's; the frozen weights' are dropped. Added into `grads` when given."""
    full = gpt_backward(cache.core, None, dloss, dlogits)
    new: dict[str, np.ndarray | None] = {}
    for prefix, adapter in cache.adapters.items():
        new[prefix + ".lora_A"], new[prefix + ".lora_B"] = adapter_grads(
            full[prefix + ".weight"], adapter)
    for name, table in cache.rows.items():
        new[name] = full[table][-cache.new_tokens:]
    return deliver(new, grads)


class LoraGPT(GPT):
    """The NumPy GPT with adapters: `params` holds the frozen base weights and the adapters
    (`adapters`, or fresh ones from sheepop.arch.lora.init_adapters(seed): B = 0); only the
    adapters have gradient buffers."""

    def __init__(self, cfg: ModelConfig, params: Params | None = None,
                 dtype: type | str = np.float32, seed: int = 0,
                 lora: LoraConfig | None = None, adapters: Params | None = None):
        if lora is None:
            raise ValueError("LoraGPT needs a LoraConfig")
        self.lora = lora
        super().__init__(cfg, params, dtype, seed)
        self.load_adapters(init_adapters(cfg, lora, seed, self.dtype, self.params)
                           if adapters is None else adapters)

    def trainable_shapes(self) -> dict[str, tuple[int, ...]]:
        """The adapters' (and new tokens' rows') names and shapes."""
        return adapter_shapes(self.cfg, self.lora)

    def forward_pass(self, idx: np.ndarray, targets: np.ndarray | None,
                     rng: np.random.Generator | None
                     ) -> tuple[np.ndarray, float | None, LoraCache]:
        return lora_forward(self.params, self.cfg, idx, targets, rng, lora=self.lora)

    def backward_pass(self, cache: LoraCache, dloss: float, dlogits: np.ndarray | None = None
                      ) -> Params:
        return lora_backward(cache, self.grads, dloss, dlogits)

    def base_logits(self, idx: np.ndarray) -> np.ndarray:
        """The logits of the base model, the adapters off (W, not W + s B A; the new tokens'
        rows as the base run's tables hold them): a reference that never moves while the
        adapters train. An evaluation: no dropout, no cache kept."""
        base = {name: w for name, w in self.params.items() if not is_adapter(name)}
        return gpt_forward(base, self.cfg, idx)[0]

    def load_adapters(self, adapters: dict[str, np.ndarray], where: str = "adapters") -> None:
        """Copy LoRA adapters in, after checking them against the model's LoraConfig."""
        check_adapters(self.cfg, self.lora, adapters, where)
        self.copy_in(adapters, list(adapters))
