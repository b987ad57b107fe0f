"""Recomputing the worked examples of docs/math parts 4-8: attention, FFN, LayerNorm, the block and
the whole model, the loss. Where both engines compute a formula, both run and must agree; the
scratch engine's (float64) values are the ones compared with the page."""

from __future__ import annotations

import math

import numpy as np
import torch

from sheepop.arch.hooks import Hooks
from sheepop.config.schema import ModelConfig
from sheepop.model import attention as torch_attention
from sheepop.model import ffn as torch_ffn
from sheepop.model import gpt as torch_gpt
from sheepop.scratch import attention as att
from sheepop.scratch import layers as L
from sheepop.scratch.block import block_forward
from sheepop.scratch.ffn import ffn_forward
from sheepop.scratch.gpt import gpt_forward
from sheepop.scratch.init import param_shapes
from sheepop.scratch.norm import layernorm_forward, rmsnorm_forward
from sheepop.softmax import softmax


def t64(a) -> torch.Tensor:
    return torch.tensor(np.asarray(a, dtype=np.float64))


def close(a, b, tol: float = 1e-5) -> None:
    a = a.detach().numpy() if hasattr(a, "detach") else np.asarray(a)
    np.testing.assert_allclose(a, np.asarray(b), rtol=tol, atol=tol)


def softmax_saturation(v):
    dots, scale = np.asarray(v["dots"], dtype=np.float64), 1 / math.sqrt(v["d_k"])
    da = np.zeros_like(dots)
    da[0] = 1.0
    out = {}
    for name, s in (("unscaled", dots), ("scaled", dots * scale)):
        a = softmax(s.copy())
        close(torch.softmax(t64(s), -1), a, 1e-12)
        out[f"a_{name}"], out[f"ds_{name}"] = a, att.softmax_backward(da, a)
    return out


def attention(v):
    x = np.asarray(v["x"], dtype=np.float64)
    T, d = x.shape
    H = int(v["n_head"])
    w_qkv = np.concatenate([v["w_q"], v["w_k"], v["w_v"]]).astype(np.float64)
    w_proj = np.asarray(v["w_proj"], dtype=np.float64)
    out, cache = att.self_attention_forward(x[None], w_qkv, None, w_proj, None, H)  # scratch
    q, k, _ = att.split_heads(cache.qkv.x @ w_qkv.T, H)
    scores = q[0] @ np.swapaxes(k[0], -1, -2) * cache.core.scale + att.causal_mask(T)
    # torch: both attention paths, the explicit one's weights read by a hook (docs/hooks.md)
    cfg = ModelConfig(n_embd=d, n_head=H, bias=False, block_size=T)
    module = torch_attention.CausalSelfAttention(cfg).double()
    seen = {}
    with torch.no_grad():
        module.qkv.weight.copy_(t64(w_qkv))
        module.proj.weight.copy_(t64(w_proj))
        fused = module(t64(x)[None])
        module.hooks = Hooks(cfg, {"blocks.0.attn.pattern": lambda a, p: seen.update(a=a)}
                             ).blocks[0]
        explicit, weights = module(t64(x)[None]), seen["a"]
    close(fused[0], out[0], 1e-12)
    close(explicit[0], out[0], 1e-6)  # (the explicit path takes its softmax in float32)
    close(weights[0], cache.core.a[0], 1e-6)
    result = {"out": out[0]}
    for h in range(H):
        result[f"scores_head{h}"] = scores[h]
        result[f"weights_head{h}"] = cache.core.a[0, h]
    return result


def activations(v):
    x = np.asarray(v["x"], dtype=np.float64)
    out = {"Phi": L.gelu_forward(x)[1].cdf}
    for name in ("gelu", "gelu_tanh", "relu"):
        y, _ = L.ACTIVATIONS[name][0](x)  # scratch
        close(torch_ffn.ACTIVATIONS[name](t64(x)), y, 1e-12)  # torch
        out[name] = y
    return out


def _ffn_module(v, activation: str) -> torch.nn.Module:
    w_fc = np.asarray(v["w_fc"], dtype=np.float64)
    module = torch_ffn.MLP(ModelConfig(n_embd=w_fc.shape[1], d_ff=w_fc.shape[0],
                                       activation=activation)).double()
    with torch.no_grad():
        for name in ("fc.weight", "fc.bias", "proj.weight", "proj.bias"):
            key = "w_" + name.split(".")[0] if name.endswith("weight") else \
                "b_" + name.split(".")[0]
            module.get_parameter(name).copy_(t64(v[key]))
    return module


def ffn(v):
    x = np.asarray(v["x"], dtype=np.float64)[None]
    args = [np.asarray(v[k], dtype=np.float64) for k in ("w_fc", "b_fc", "w_proj", "b_proj")]
    out = {"h": x[0] @ args[0].T + args[1]}
    for act in ("gelu", "relu"):
        y, cache = ffn_forward(x, *args, act)  # scratch
        with torch.no_grad():
            close(_ffn_module(v, act)(t64(x)), y, 1e-12)  # torch
        a = cache.proj.x  # the activations, as the output projection received them
        out[f"a_{act}"], out[f"out_{act}"] = a[0], y[0]
    return out


def layernorm(v):
    x = np.asarray(v["x"], dtype=np.float64)
    gamma, beta = np.asarray(v["gamma"], float), np.asarray(v["beta"], float)
    eps = float(v["eps"])
    y, cache = layernorm_forward(x.copy(), gamma, beta, eps)  # scratch
    ln = torch.nn.LayerNorm(x.shape[1], eps=eps).double()  # torch, as Block.ln1 and GPT.ln_f
    with torch.no_grad():
        ln.weight.copy_(t64(gamma))
        ln.bias.copy_(t64(beta))
        close(ln(t64(x)), y, 1e-9)
    return {"mu": x.mean(1), "var": x.var(1), "unbiased_var": x.var(1, ddof=1),
            "rstd": cache.rstd[:, 0], "xhat": cache.xhat, "y": y,
            "mean_square_xhat": (cache.xhat ** 2).mean(1)}


def rmsnorm(v):
    x = np.asarray(v["x"], dtype=np.float64)
    gamma, eps = np.asarray(v["gamma"], float), float(v["eps"])
    y, cache = rmsnorm_forward(x.copy(), gamma, eps)  # scratch
    norm = torch.nn.RMSNorm(x.shape[1], eps=eps).double()  # torch, model.norm = rmsnorm
    with torch.no_grad():
        norm.weight.copy_(t64(gamma))
        close(norm(t64(x)), y, 1e-9)
    return {"mean_square": (x * x).mean(1), "rstd": cache.rstd[:, 0], "y": y}


def rule(shape: tuple[int, ...], s: int) -> np.ndarray:
    """The pages' weight rule: W[i, j] = ((7 (i + 1) + 3 (j + 1) + s) mod 11 - 5) / 10,
    vectors with j = 0, s the parameter's index in the model's parameter list."""
    i = np.arange(shape[0])[:, None]
    j = np.arange(shape[1] if len(shape) > 1 else 1)[None, :]
    return ((((7 * (i + 1) + 3 * (j + 1) + s) % 11) - 5) / 10.0).reshape(shape)


def rule_params(cfg: ModelConfig) -> dict[str, np.ndarray]:
    """LayerNorm gains 1 and shifts 0 (their initial values); every other parameter by `rule`."""
    params = {}
    for s, (name, shape) in enumerate(param_shapes(cfg).items()):
        if ".ln" in name or name.startswith("ln_f"):
            params[name] = np.ones(shape) if name.endswith("weight") else np.zeros(shape)
        else:
            params[name] = rule(shape, s)
    return params


def tiny_config(v) -> ModelConfig:
    return ModelConfig(vocab_size=int(v["n_vocab"]), n_embd=int(v["d"]), n_head=int(v["n_head"]),
                       n_layer=int(v["n_layer"]), d_ff=int(v["d_ff"]),
                       block_size=len(v["ids"]), tie_weights=True)


def torch_model(cfg: ModelConfig, params: dict[str, np.ndarray]) -> torch_gpt.GPT:
    model = torch_gpt.GPT(cfg).double()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(t64(params[name]))
    return model.eval()


def forward_pass_params(v) -> tuple[ModelConfig, dict[str, np.ndarray], np.ndarray]:
    """The configuration, parameters and token ids of the pages' small model (part 7)."""
    cfg = tiny_config(v)
    params = rule_params(cfg)
    params["tok_emb.weight"] = np.asarray(v["E"], dtype=np.float64)
    return cfg, params, np.asarray(v["ids"], dtype=np.int64)[None]


def forward_pass(v):
    cfg, params, idx = forward_pass_params(v)
    logits, _, cache = gpt_forward(params, cfg, idx)  # scratch, the whole model
    with torch.no_grad():  # torch (its sinusoidal table is float32)
        close(torch_model(cfg, params)(torch.from_numpy(idx))[0], logits, 1e-7)
    h0 = params["tok_emb.weight"][idx[0]] + _positions(cfg)
    proj = cache.blocks[0].attn.proj  # the output projection's cache holds its input
    attn_out = proj.x[0] @ proj.w.T + params["blocks.0.attn.proj.bias"]
    x2, _ = block_forward(h0[None], params, "blocks.0.", cfg)
    return {"h0": h0, "attn_out": attn_out, "x1": h0 + attn_out, "ffn_out": x2[0] - h0 - attn_out,
            "x2": x2[0], "hf": cache.ln_f.xhat[0], "logits": logits[0],
            "probs_last": softmax(logits[0, -1].copy())}


def _positions(cfg: ModelConfig) -> np.ndarray:
    from sheepop.scratch.positions import sinusoidal_positions_forward
    return sinusoidal_positions_forward({}, cfg, slice(0, cfg.block_size), np.float64)[0]


def parameter_count(v):
    base = dict(vocab_size=int(v["n_vocab"]), n_embd=int(v["d"]), n_layer=int(v["n_layer"]),
                n_head=int(v["n_head"]), block_size=int(v["block_size"]))
    out = {}
    for key, extra in (("tied", {}), ("untied", {"tie_weights": False}),
                       ("learned_positions", {"pos_encoding": "learned"})):
        cfg = ModelConfig(**base, **extra)
        n = sum(int(np.prod(s)) for s in param_shapes(cfg).values())  # scratch
        assert torch_gpt.GPT(cfg).num_params() == n  # torch
        out[key] = n
    one = ModelConfig(**{**base, "n_layer": 1})
    out["per_block"] = sum(int(np.prod(s)) for k, s in param_shapes(one).items()
                           if k.startswith("blocks.0."))
    return out


def _losses(z, y) -> tuple[float, int, np.ndarray]:
    """Scratch mean loss, count and probabilities; the torch loss must agree."""
    z, y = np.asarray(z, dtype=np.float64), np.asarray(y, dtype=np.int64)
    loss, cache = L.cross_entropy_forward(z, y)  # scratch
    close(torch_gpt.cross_entropy(t64(z), torch.from_numpy(y)), loss, 1e-6)  # torch (float32)
    return loss, cache.n, cache.probs


def cross_entropy(v):
    loss, n, probs = _losses(v["z"], v["y"])
    y = np.asarray(v["y"], dtype=np.int64)
    counted = np.flatnonzero(y != -1)
    return {"probs": probs, "token_losses": -np.log(probs[counted, y[counted]]), "N": n,
            "loss": loss, "perplexity": math.exp(loss), "bits_per_token": loss / math.log(2)}


def uniform_loss(v):
    n = int(v["n_vocab"])
    loss, _, _ = _losses(np.zeros((1, n)), [0])
    return {"loss": loss, "perplexity": math.exp(loss)}


def accumulation(v):
    out, total, n_total, means = {}, 0.0, 0, []
    for j in (1, 2):
        loss, n, _ = _losses(v[f"z{j}"], v[f"y{j}"])
        z, y = t64(v[f"z{j}"]), torch.tensor(v[f"y{j}"], dtype=torch.long)
        loss_sum = torch_gpt.cross_entropy(z, y, reduction="sum")  # as TorchEngine.micro_losses
        close(loss_sum, loss * n, 1e-6)
        out[f"sum{j}"], out[f"n{j}"] = loss * n, n
        total, n_total = total + loss * n, n_total + n
        means.append(loss)
    return {**out, "mean_of_means": sum(means) / 2, "loss": total / n_total}


def bits_per_byte_example(v):
    """The same text's nats, per token and per byte, under a char and a byte-level tokenizer."""
    from sheepop.tokenizers import train_tokenizer
    from sheepop.tokenizers.token_bytes import TargetBytes, bits_per_byte, token_bytes
    text, out = v["text"], {}
    for name, tok in (("char", train_tokenizer("char", [text])),
                      ("byte", train_tokenizer("bpe", [text], vocab_size=259))):  # no merge
        ids = np.asarray(tok.encode(text), dtype=np.int64)[None]
        x, y = ids[:, :-1], ids[:, 1:]
        nats = np.asarray(v[f"{name}_nats"], dtype=np.float64)
        assert nats.shape == (y.shape[1],), f"{name}_nats: one loss a target"
        loss = nats.sum() / len(nats)
        out.update({f"{name}_bytes": token_bytes(tok)[y[0]], f"{name}_loss": loss,
                    f"{name}_bits_per_token": loss / math.log(2),
                    f"{name}_bits_per_byte": bits_per_byte(nats.sum(),
                                                           TargetBytes(tok).count(x, y))})
    return out


CHECKS = {
    "softmax_saturation": (("dots", "d_k"), softmax_saturation),
    "attention": (("x", "n_head", "w_q", "w_k", "w_v", "w_proj"), attention),
    "activations": (("x",), activations),
    "ffn": (("x", "w_fc", "b_fc", "w_proj", "b_proj"), ffn),
    "layernorm": (("x", "gamma", "beta", "eps"), layernorm),
    "rmsnorm": (("x", "gamma", "eps"), rmsnorm),
    "parameter_count": (("n_vocab", "d", "n_layer", "n_head", "block_size"), parameter_count),
    "cross_entropy": (("z", "y"), cross_entropy),
    "uniform_loss": (("n_vocab",), uniform_loss),
    "accumulation": (("z1", "y1", "z2", "y2"), accumulation),
    "bits_per_byte": (("text", "char_nats", "byte_nats"), bits_per_byte_example),
    "forward_pass": (("n_vocab", "d", "n_head", "n_layer", "d_ff", "E", "ids"), forward_pass),
}
