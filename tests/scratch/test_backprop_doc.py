"""docs/backprop.md's worked examples, recomputed with the scratch engine's own functions.

Each ```example block names a layer, gives its inputs and lists the values a reader can check by
hand. Every listed value that is not an input must be produced by the layer's code here and
agree with it to the decimals printed (half a unit in the last place): a wrong number in the docs
fails, and so does a value the code does not compute.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from sheepop import softmax as sm
from sheepop.config.schema import ModelConfig
from sheepop.positional import sinusoidal_table
from sheepop.scratch import attention as att
from sheepop.scratch import layers as L
from sheepop.scratch import norm as N
from sheepop.scratch import positions as P
from sheepop.scratch.adamw import AdamW, clip_grad_norm
from sheepop.scratch.block import block_backward, block_forward
from sheepop.scratch.ffn import ffn_backward, ffn_forward
from sheepop.scratch.gpt import gpt_backward, gpt_forward

DOC = Path(__file__).resolve().parents[2] / "docs" / "backprop.md"
NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def parse_examples(text: str) -> list[dict]:
    """Each ```example block: `layer: name` then `key = value` lines (JSON numbers/lists);
    `#` starts a comment. Values keep their text so the printed precision is known."""
    examples = []
    for block in re.findall(r"```example\n(.*?)```", text, re.S):
        ex: dict = {"values": {}, "texts": {}}
        for line in block.splitlines():
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            if line.startswith("layer:"):
                ex["layer"] = line.split(":", 1)[1].strip()
                continue
            key, _, value = line.partition("=")
            ex["values"][key.strip()] = np.array(json.loads(value), dtype=np.float64)
            ex["texts"][key.strip()] = value
        examples.append(ex)
    return examples


def weight_rule(shape: tuple[int, ...], salt: int) -> np.ndarray:
    """The formula docs/backprop.md uses for the block example's weights:
    W[i, j] = ((7 (i + 1) + 3 (j + 1) + salt) mod 11 - 5) / 10 (vectors: j = 0)."""
    i = np.arange(shape[0])[:, None]
    j = np.arange(shape[1] if len(shape) > 1 else 1)[None, :]
    w = (((7 * (i + 1) + 3 * (j + 1) + salt) % 11) - 5) / 10.0
    return w.reshape(shape)


# Each layer: (input names, function of the inputs returning every value it can check).
def linear(v):
    y, c = L.linear_forward(v["x"], v["w"], v["b"])
    dx, dw, db = L.linear_backward(v["dy"], c)
    return {"y": y, "dx": dx, "dw": dw, "db": db}


def embedding(v):
    out, c = L.embedding_forward(v["idx"].astype(int), v["E"])
    return {"out": out, "dE": L.embedding_backward(v["dy"], c)}


def learned_positions(v):
    T = v["dy"].shape[1]
    start = int(v["start"])
    _, c = P.learned_positions_forward(v["P"], slice(start, start + T))
    return {"dP": P.learned_positions_backward(v["dy"], c)}


def layernorm(v):
    x = v["x"]
    y, c = N.layernorm_forward(x, v["gamma"], v["beta"], float(v["eps"]))
    dx, dgamma, dbeta = N.layernorm_backward(v["dy"], c)
    mu = x.mean(-1)
    g = v["dy"] * v["gamma"]
    return {"mu": mu, "var": ((x - mu[:, None]) ** 2).mean(-1), "rstd": c.rstd[:, 0],
            "xhat": c.xhat, "y": y, "g": g, "mean_g": g.mean(-1),
            "mean_g_xhat": (g * c.xhat).mean(-1), "dx": dx, "dgamma": dgamma, "dbeta": dbeta}


def activation(name):
    def run(v):
        y, c = L.ACTIVATIONS[name][0](v["x"])
        out = {"y": y, "dx": L.ACTIVATIONS[name][1](v["dy"], c)}
        if name == "gelu":
            out.update(Phi=c.cdf, phi=np.exp(-v["x"] ** 2 / 2) / np.sqrt(2 * np.pi))
        return out
    return run


def dropout(v):
    scaled = v["m"] / (1.0 - float(v["p"]))
    return {"y": v["x"] * scaled, "dx": L.dropout_backward(v["dy"], scaled)}


def softmax(v):
    a = sm.softmax(v["s"].copy())
    return {"a": a, "ds": att.softmax_backward(v["da"], a)}


def cross_entropy(v):
    loss, c = L.cross_entropy_forward(v["z"], v["y"].astype(int))
    return {"P": c.probs, "N": c.n, "loss": loss, "dz": L.cross_entropy_backward(1.0, c)}


def attention_core(v):
    q, k, vv = (v[n][None, None] for n in ("q", "k", "v"))
    y, c = att.attention_core_forward(q, k, vv)
    dq, dk, dv = att.attention_core_backward(v["dy"][None, None], c)
    dad = v["dy"] @ v["v"].T
    scale = 1.0 / np.sqrt(q.shape[-1])
    s = v["q"] @ v["k"].T * scale
    return {"S": np.where(np.tril(np.ones_like(s)) > 0, s, -np.inf), "A": c.a[0, 0],
            "y": y[0, 0], "dA": dad, "dS": att.softmax_backward(dad, c.a[0, 0]) * scale,
            "dq": dq[0, 0], "dk": dk[0, 0], "dv": dv[0, 0]}


def self_attention(v):
    out, c = att.self_attention_forward(v["x"][None], v["w_qkv"], None, v["w_proj"], None,
                                        int(v["n_head"]))
    dx, grads = att.self_attention_backward(v["dy"][None], c)
    return {"qkv": c.qkv.x[0] @ v["w_qkv"].T, "A": c.core.a[0], "out": out[0], "dx": dx[0],
            "dw_qkv": grads["qkv.weight"], "dw_proj": grads["proj.weight"]}


def ffn(v):
    out, c = ffn_forward(v["x"], v["w_fc"], v["b_fc"], v["w_proj"], v["b_proj"], "relu")
    dx, grads = ffn_backward(v["dy"], c)
    return {"h": v["x"] @ v["w_fc"].T + v["b_fc"], "out": out, "dx": dx,
            "dw_fc": grads["fc.weight"], "db_fc": grads["fc.bias"],
            "dw_proj": grads["proj.weight"], "db_proj": grads["proj.bias"]}


def block(v):
    T, d = v["x"].shape
    cfg = ModelConfig(vocab_size=2, block_size=T, n_layer=1, n_head=int(v["n_head"]), n_embd=d,
                      d_ff=int(v["d_ff"]), activation="gelu")
    shapes = {"attn.qkv.weight": (3 * d, d), "attn.qkv.bias": (3 * d,),
              "attn.proj.weight": (d, d), "attn.proj.bias": (d,),
              "ffn.fc.weight": (cfg.ffn_dim, d), "ffn.fc.bias": (cfg.ffn_dim,),
              "ffn.proj.weight": (d, cfg.ffn_dim), "ffn.proj.bias": (d,)}
    params = {f"b.{n}": weight_rule(s, salt) for salt, (n, s) in enumerate(shapes.items())}
    params.update({"b.ln1.weight": np.ones(d), "b.ln1.bias": np.zeros(d),
                   "b.ln2.weight": np.ones(d), "b.ln2.bias": np.zeros(d)})
    y, c = block_forward(v["x"][None], params, "b.", cfg)
    dx, grads = block_backward(v["dy"][None], c, "b.")
    return {"y": y[0], "dx": dx[0], "dgamma1": grads["b.ln1.weight"],
            "dgamma2": grads["b.ln2.weight"]}


def tied_model(v):
    E = v["E"]
    V, d = E.shape
    T = v["idx"].size
    cfg = ModelConfig(vocab_size=V, block_size=T, n_layer=0, n_head=1, n_embd=d)
    params = {"tok_emb.weight": E, "ln_f.weight": np.ones(d), "ln_f.bias": np.zeros(d)}
    idx, y = v["idx"].astype(int)[None], v["targets"].astype(int)[None]
    logits, loss, c = gpt_forward(params, cfg, idx, y)
    dE = gpt_backward(c)["tok_emb.weight"]
    dlogits = L.cross_entropy_backward(1.0, c.loss)[0]
    hf = c.ln_f.xhat[0]
    dE_head = dlogits.T @ hf
    P = sinusoidal_table(T, d) * cfg.sinusoid_scale
    return {"P": P, "h0": E[idx[0]] + P, "hf": hf,
            "logits": logits[0], "loss": loss, "dlogits": dlogits, "dE_head": dE_head,
            "dE_lookup": dE - dE_head, "dE": dE}


def adamw(v):
    p = {"w": v["p"].copy()}
    opt = AdamW(p, lr=float(v["lr"]), betas=(float(v["beta1"]), float(v["beta2"])),
                eps=float(v["eps"]), weight_decay=float(v["wd"]))
    for g in v["grads"]:
        opt.step({"w": g.copy()})
    return {"m": opt.exp_avg["w"], "v": opt.exp_avg_sq["w"], "p_new": p["w"]}


def clipping(v):
    grads = {"a": v["ga"].copy(), "b": v["gb"].copy()}
    norm = clip_grad_norm(grads, float(v["max_norm"]))
    return {"norm": norm, "ga_clipped": grads["a"], "gb_clipped": grads["b"]}


LAYERS = {
    "linear": (("x", "w", "b", "dy"), linear),
    "embedding": (("E", "idx", "dy"), embedding),
    "learned_positions": (("P", "start", "dy"), learned_positions),
    "layernorm": (("x", "gamma", "beta", "eps", "dy"), layernorm),
    "gelu": (("x", "dy"), activation("gelu")),
    "gelu_tanh": (("x", "dy"), activation("gelu_tanh")),
    "relu": (("x", "dy"), activation("relu")),
    "dropout": (("x", "m", "p", "dy"), dropout),
    "softmax": (("s", "da"), softmax),
    "cross_entropy": (("z", "y"), cross_entropy),
    "attention_core": (("q", "k", "v", "dy"), attention_core),
    "self_attention": (("x", "w_qkv", "w_proj", "n_head", "dy"), self_attention),
    "ffn": (("x", "w_fc", "b_fc", "w_proj", "b_proj", "dy"), ffn),
    "block": (("x", "n_head", "d_ff", "dy"), block),
    "tied_model": (("E", "idx", "targets"), tied_model),
    "adamw": (("p", "grads", "lr", "beta1", "beta2", "eps", "wd"), adamw),
    "clipping": (("ga", "gb", "max_norm"), clipping),
}

EXAMPLES = parse_examples(DOC.read_text(encoding="utf-8"))


def test_the_doc_has_an_example_for_every_layer():
    assert sorted(ex["layer"] for ex in EXAMPLES) == sorted(LAYERS)


def decimals(token: str) -> int:
    mantissa, _, exponent = token.lower().partition("e")
    places = len(mantissa.split(".")[1]) if "." in mantissa else 0
    return places - int(exponent or 0)


@pytest.mark.parametrize("ex", EXAMPLES, ids=[ex.get("layer", "?") for ex in EXAMPLES])
def test_worked_example(ex):
    inputs, compute = LAYERS[ex["layer"]]
    values = ex["values"]
    computed = compute({k: values[k] for k in inputs})
    shown = [k for k in values if k not in inputs]
    assert shown, "an example must show at least one computed value"
    for key in shown:
        assert key in computed, f"{ex['layer']}: the doc shows '{key}', which the test cannot check"
        got = np.broadcast_to(np.asarray(computed[key], dtype=np.float64), values[key].shape)
        tokens = NUMBER.findall(ex["texts"][key].replace("-Infinity", ""))
        doc = values[key].reshape(-1)
        finite = np.isfinite(doc)
        assert np.array_equal(np.isinf(doc), np.isinf(got.reshape(-1))), key
        tol = np.array([0.5 * 10.0 ** -decimals(t) for t in tokens]) + 1e-12
        assert tol.size == finite.sum(), f"{ex['layer']}.{key}: cannot read the numbers"
        err = np.abs(got.reshape(-1)[finite] - doc[finite])
        assert np.all(err <= tol), (
            f"{ex['layer']}.{key}: the doc says {doc[finite][err > tol]}, the code computes "
            f"{got.reshape(-1)[finite][err > tol]}")
