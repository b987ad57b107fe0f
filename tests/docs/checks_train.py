"""Recomputing the worked examples of docs/math parts 9-12: gradients, clipping, AdamW, the
learning-rate schedule and generation. Both engines run where both compute the formula."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from checks_model import close, forward_pass_params, t64, torch_model

from sheepop.arch.kv_cache import KVCache, cache_shape
from sheepop.arch.params import decays
from sheepop.config.schema import ModelConfig, SampleConfig
from sheepop.generation.generate import generate
from sheepop.generation.sample import draw, penalize_repeats, probabilities
from sheepop.model.gpt import GPT as TorchGPT
from sheepop.model.gpt import cross_entropy as torch_cross_entropy
from sheepop.schedule import lr_at, lr_for, wsd_lr_at
from sheepop.scratch import layers as L
from sheepop.scratch.adamw import AdamW, clip_grad_norm
from sheepop.scratch.gpt import gpt_backward, gpt_forward, new_cache
from sheepop.train.optimizers import decay_groups


def ce_gradient(v):
    z, y = np.asarray(v["z"], dtype=np.float64), np.asarray(v["y"], dtype=np.int64)
    _, cache = L.cross_entropy_forward(z, y)
    dz = L.cross_entropy_backward(1.0, cache)  # scratch
    zt = t64(z).requires_grad_()
    torch_cross_entropy(zt, torch.from_numpy(y)).backward()  # torch autograd
    close(zt.grad, dz, 1e-6)
    return {"dz": dz}


def model_gradient(v):
    cfg, params, idx = forward_pass_params(v)
    targets = np.asarray(v["targets"], dtype=np.int64)[None]
    logits, loss, cache = gpt_forward(params, cfg, idx, targets)  # scratch
    grads = gpt_backward(cache)
    model = torch_model(cfg, params)  # torch autograd
    _, torch_loss = model(torch.from_numpy(idx), torch.from_numpy(targets))
    torch_loss.backward()
    close(torch_loss, loss, 1e-7)
    for name, p in model.named_parameters():
        close(p.grad, grads[name], 1e-6)
    dlogits = L.cross_entropy_backward(1.0, cache.loss)[0]
    return {"loss": loss, "dlogits": dlogits, "d_hf": dlogits @ params["tok_emb.weight"],
            "d_ln_f_weight": grads["ln_f.weight"], "d_ln_f_bias": grads["ln_f.bias"],
            "dE": grads["tok_emb.weight"]}


def clipping(v):
    grads = {"a": np.asarray(v["g_a"], dtype=np.float64),
             "b": np.asarray(v["g_b"], dtype=np.float64)}
    tensors = [t64(g) for g in grads.values()]
    params = [torch.zeros_like(t, requires_grad=True) for t in tensors]
    for p, t in zip(params, tensors):
        p.grad = t.clone()
    torch_norm = torch.nn.utils.clip_grad_norm_(params, float(v["max_norm"]))  # torch
    norm = clip_grad_norm(grads, float(v["max_norm"]))  # scratch, in place
    close(torch_norm, norm, 1e-12)
    close(params[0].grad, grads["a"], 1e-12)
    close(params[1].grad, grads["b"], 1e-12)
    return {"norm": norm, "factor": float(v["max_norm"]) / (norm + 1e-6),
            "g_a_clipped": grads["a"], "g_b_clipped": grads["b"],
            "norm_after": float(np.sqrt((grads["a"] ** 2).sum() + (grads["b"] ** 2).sum()))}


def _torch_steps(opt_cls, p0, grads, lr, betas, eps, wd) -> list[np.ndarray]:
    p = t64(p0).requires_grad_()
    opt = opt_cls([p], lr=lr, betas=betas, eps=eps, weight_decay=wd)
    out = []
    for g in grads:
        p.grad = t64(g)
        opt.step()
        out.append(p.detach().numpy().copy())
    return out


def adamw(v):
    p0, grads = np.asarray(v["p"], dtype=np.float64), np.asarray(v["grads"], dtype=np.float64)
    lr, wd, eps = float(v["lr"]), float(v["wd"]), float(v["eps"])
    betas = (float(v["beta1"]), float(v["beta2"]))
    params = {"w": p0[None].copy()}  # a 1 x n matrix: a tensor that decays
    opt = AdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=wd)  # scratch
    out = {}
    for t, g in enumerate(grads, start=1):
        opt.step({"w": g[None].copy()})
        out[f"m_hat_{t}"] = opt.exp_avg["w"][0] / (1 - betas[0] ** t)
        out[f"v_hat_{t}"] = opt.exp_avg_sq["w"][0] / (1 - betas[1] ** t)
        out[f"p_adamw_{t}"] = params["w"][0].copy()
    torch_adamw = _torch_steps(torch.optim.AdamW, p0, grads, lr, betas, eps, wd)
    for t, p in enumerate(torch_adamw, start=1):
        close(p, out[f"p_adamw_{t}"], 1e-12)
    # Adam with L2 regularisation: wd * p added to the gradient (torch.optim.Adam's weight_decay)
    for t, p in enumerate(_torch_steps(torch.optim.Adam, p0, grads, lr, betas, eps, wd), 1):
        out[f"p_adam_l2_{t}"] = p
    return out


def decay_flags(v):
    cfg = ModelConfig(vocab_size=5, n_embd=4, n_head=2, n_layer=1, block_size=4)
    model = TorchGPT(cfg)
    decayed = {id(p) for p in decay_groups(list(model.parameters()), 0.1)[0]["params"]}
    torch_flags = {n: id(p) in decayed for n, p in model.named_parameters()}
    flags = {n: decays(p.shape) for n, p in model.named_parameters()}  # shared rule
    assert flags == torch_flags
    return {"decayed": [n for n in v["names"] if flags[n]],
            "not_decayed": [n for n in v["names"] if not flags[n]]}


def schedule(v):
    args = [float(v[k]) for k in ("lr_max", "min_lr")] + [int(v["warmup"]), int(v["decay"])]
    return {"lr": [lr_at(step, *args) for step in v["steps"]]}


def schedule_wsd(v):
    args = [float(v[k]) for k in ("lr_max", "min_lr")] + [int(v["warmup"]), int(v["decay"])]
    return {"lr": [wsd_lr_at(step, *args, float(v["cooldown"])) for step in v["steps"]]}


def schedule_preset(v):
    from sheepop.config.build import build_config
    train = build_config(v["preset"]).train
    return {"lr": [lr_for(int(step), train) for step in v["steps"]],
            "warmup": train.warmup_steps, "total_steps": train.steps}


def sampling(v):
    z = np.asarray(v["z"], dtype=np.float64)
    out = {"greedy": probabilities(z, temperature=0)}
    for key, kw in (("t1", {}), ("t05", {"temperature": 0.5}), ("t2", {"temperature": 2.0}),
                    ("top_k2", {"top_k": 2}), ("top_p09", {"top_p": 0.9})):
        out[key] = probabilities(z, **kw)
    return out


class FixedUniform:
    """A stand-in for numpy's Generator whose `random` returns the given numbers."""

    def __init__(self, u: float):
        self.u = u

    def random(self, n: int) -> np.ndarray:
        return np.full(n, self.u)


def draw_tokens(v):
    probs = np.asarray(v["probs"], dtype=np.float64)
    return {"cdf": np.cumsum(probs),
            "tokens": [draw(probs, FixedUniform(float(u))) for u in v["u"]]}


def repetition(v):
    z = np.asarray(v["z"], dtype=np.float64)
    seen = np.zeros(len(z), dtype=bool)
    seen[np.asarray(v["context"], dtype=np.int64)] = True
    return {"penalized": penalize_repeats(z, seen, float(v["penalty"]))}


def kv_cache(v):
    from sheepop.config.build import build_config
    cfg = build_config(v["preset"]).model
    # As GPT.new_cache makes it ("meta": sizes only, no memory), and the NumPy engine's, each
    # grown to the whole context (a cache grows with the tokens: sheepop.arch.kv_cache).
    torch_cache = KVCache.growing(cfg, 1, lambda shape: torch.zeros(shape, device="meta"))
    scratch_cache = new_cache(cfg, 1, dtype=np.float32)
    for cache in (torch_cache, scratch_cache):
        cache.reserve(cfg.block_size)
    assert torch_cache.k.shape == cache_shape(cfg, 1)
    torch_bytes = (torch_cache.k.numel() + torch_cache.v.numel()) * 4
    scratch_bytes = scratch_cache.k.nbytes + scratch_cache.v.nbytes
    assert torch_bytes == scratch_bytes
    return {"bytes_per_token": scratch_bytes // cfg.block_size, "bytes_full": scratch_bytes,
            "mib_full": scratch_bytes / 2 ** 20}


class CountingLM:
    """A language model that only counts the positions each call computes."""

    def __init__(self, block_size: int, vocab: int = 4):
        self.block_size, self.vocab, self.length, self.positions = block_size, vocab, 0, 0

    def _logits(self) -> np.ndarray:
        return np.zeros(self.vocab)

    def prefill(self, ids: Sequence[int]) -> np.ndarray:
        self.length = len(ids)
        self.positions += len(ids)
        return self._logits()

    def decode(self, token: int) -> np.ndarray:
        self.length += 1
        self.positions += 1
        return self._logits()

    def full(self, ids: Sequence[int]) -> np.ndarray:
        self.positions += len(ids)
        return self._logits()

    @property
    def cache_length(self) -> int:
        return self.length


def generation_cost(v):
    out = {}
    cfg = SampleConfig(max_new_tokens=int(v["new_tokens"]), temperature=0)
    for T in v["block_sizes"]:
        for cached in (True, False):
            lm = CountingLM(int(T))
            list(generate(lm, [0] * int(v["prompt"]), cfg, use_cache=cached))
            out[f"{'cached' if cached else 'uncached'}_T{int(T)}"] = lm.positions
    return out


CHECKS = {
    "ce_gradient": (("z", "y"), ce_gradient),
    "model_gradient": (("n_vocab", "d", "n_head", "n_layer", "d_ff", "E", "ids", "targets"),
                       model_gradient),
    "clipping": (("g_a", "g_b", "max_norm"), clipping),
    "adamw": (("p", "grads", "lr", "beta1", "beta2", "eps", "wd"), adamw),
    "decay_groups": (("names",), decay_flags),
    "schedule": (("lr_max", "min_lr", "warmup", "decay", "steps"), schedule),
    "schedule_wsd": (("lr_max", "min_lr", "warmup", "decay", "cooldown", "steps"), schedule_wsd),
    "schedule_preset": (("preset", "steps"), schedule_preset),
    "sampling": (("z",), sampling),
    "draw": (("probs", "u"), draw_tokens),
    "repetition_penalty": (("z", "context", "penalty"), repetition),
    "kv_cache": (("preset",), kv_cache),
    "generation_cost": (("prompt", "new_tokens", "block_sizes"), generation_cost),
}
