"""Recomputing the worked examples of docs/finetune.md's "LoRA: the mathematics": one adapted
linear layer forward, backward and merged (the scratch engine's functions, checked against torch
autograd through the torch engine's LoRALinear), and the adapters' share of a model's
parameters (the shared shapes, checked against the torch model with adapters added)."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from sheepop.arch.lora import LoraConfig, adapter_param_count, merge
from sheepop.config.build import build_config
from sheepop.config.finetune import LORA_TARGETS
from sheepop.config.model_size import param_count
from sheepop.model import GPT as TorchGPT
from sheepop.model import add_lora
from sheepop.model.lora import LoRALinear
from sheepop.scratch.lora import Adapter, lora_linear_forward, lora_linear_grads


def f64(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


def lora_layer(v):
    x, w, b, a, bb, dy = (f64(v[k]) for k in ("x", "W", "b", "A", "B", "dy"))
    alpha = float(v["alpha"])
    r = a.shape[0]
    s = alpha / r
    y, cache = lora_linear_forward(x, w, b, Adapter(a, bb, s))  # scratch
    dx, grads = lora_linear_grads(dy, cache, "layer")
    assert grads["layer.weight"] is None and grads["layer.bias"] is None  # frozen
    base = torch.nn.Linear(w.shape[1], w.shape[0]).double()  # torch autograd
    with torch.no_grad():
        base.weight.copy_(torch.tensor(w))
        base.bias.copy_(torch.tensor(b))
    layer = LoRALinear(base, r, s)
    layer.weight.requires_grad_(False)
    layer.bias.requires_grad_(False)
    with torch.no_grad():
        layer.lora_A.copy_(torch.tensor(a))
        layer.lora_B.copy_(torch.tensor(bb))
    xt = torch.tensor(x, requires_grad=True)
    yt = layer(xt)
    yt.backward(torch.tensor(dy))
    for mine, theirs in ((y, yt), (dx, xt.grad), (grads["layer.lora_A"], layer.lora_A.grad),
                         (grads["layer.lora_B"], layer.lora_B.grad)):
        np.testing.assert_allclose(mine, theirs.detach().numpy(), rtol=1e-12, atol=1e-12)
    lora = LoraConfig(r, alpha, LORA_TARGETS)
    merged = merge({"layer.weight": w}, {"layer.lora_A": a, "layer.lora_B": bb}, lora)
    w_merged = merged["layer.weight"]
    full = dy.T @ x  # the gradient W would get if it trained
    return {"s": s, "h": x @ a.T, "base": x @ w.T + b, "y": y, "dB": grads["layer.lora_B"],
            "dh": s * dy @ bb, "dA": grads["layer.lora_A"], "dx": dx, "W_merged": w_merged,
            "y_merged": x @ w_merged.T + b, "dW_full": full, "s_dW_full_At": s * full @ a.T,
            "s_Bt_dW_full": s * bb.T @ full, "params_full": w.size,
            "params_lora": a.size + bb.size}


def lora_share(v):
    out: dict[str, list] = {}
    for targets in v["targets"]:
        cfg = dataclasses.replace(build_config(v["preset"]).model,
                                  vocab_size=int(v["vocab_size"]))
        lora = LoraConfig(int(v["rank"]), 2.0 * int(v["rank"]), targets)
        adapters = adapter_param_count(cfg, lora)
        base = param_count(cfg)
        model = add_lora(TorchGPT(cfg), lora)  # torch: what actually trains
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        assert trainable == adapters and model.num_params() == base + adapters
        out.setdefault("base_params", []).append(base)
        out.setdefault("adapter_params", []).append(adapters)
        out.setdefault("percent_trainable", []).append(100.0 * adapters / (base + adapters))
    return out


CHECKS = {
    "lora_layer": (("x", "W", "b", "A", "B", "alpha", "dy"), lora_layer),
    "lora_share": (("preset", "vocab_size", "rank", "targets"), lora_share),
}
