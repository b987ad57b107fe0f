"""GPT-2's weights and config in Hugging Face's layout, to and from sheepop's.

A sheepop model with learned positions, GELU-tanh, biases, a tied head and no head bias is
exactly GPT-2 (pre-norm blocks, fused QKV with Q, K, V in that order and heads in contiguous
slices, final LayerNorm). The names map one to one:

    sheepop                          Hugging Face GPT2LMHeadModel
    tok_emb.weight                   transformer.wte.weight
    pos_emb.weight                   transformer.wpe.weight
    blocks.{i}.ln1 / ln2             transformer.h.{i}.ln_1 / ln_2
    blocks.{i}.attn.qkv              transformer.h.{i}.attn.c_attn
    blocks.{i}.attn.proj             transformer.h.{i}.attn.c_proj
    blocks.{i}.ffn.fc / proj         transformer.h.{i}.mlp.c_fc / c_proj
    ln_f                             transformer.ln_f
    head.weight (untied only)        lm_head.weight

GPT-2's linear layers are `Conv1D`s, which compute y = x W + b with W stored (in, out): the
transpose of torch's `nn.Linear` (out, in), sheepop's convention. Every linear weight is
transposed on the way in and out; biases, LayerNorms and embeddings are copied as they are.

Sinusoidal positions export too: sheepop adds s * P[pos] to the token embeddings (P the fixed
table of sheepop.positional, s = `sinusoid_scale`), and GPT-2 adds wpe[pos], so wpe = s * P
gives the same logits (the table becomes a learned one if the exported model is trained on).
The exact GELU exports as `gelu`, the tanh form as `gelu_new`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from sheepop.config.schema import ModelConfig
from sheepop.errors import UserError
from sheepop.interop.export_checks import refuse_first, settings_neither_has
from sheepop.positional import sinusoidal_table

Weights = dict[str, np.ndarray]

# sheepop name -> Hugging Face name, per block; the Conv1D ones are transposed.
_BLOCK = {
    "ln1.weight": "ln_1.weight", "ln1.bias": "ln_1.bias",
    "attn.qkv.weight": "attn.c_attn.weight", "attn.qkv.bias": "attn.c_attn.bias",
    "attn.proj.weight": "attn.c_proj.weight", "attn.proj.bias": "attn.c_proj.bias",
    "ln2.weight": "ln_2.weight", "ln2.bias": "ln_2.bias",
    "ffn.fc.weight": "mlp.c_fc.weight", "ffn.fc.bias": "mlp.c_fc.bias",
    "ffn.proj.weight": "mlp.c_proj.weight", "ffn.proj.bias": "mlp.c_proj.bias",
}
_CONV1D = {"attn.qkv.weight", "attn.proj.weight", "ffn.fc.weight", "ffn.proj.weight"}
_TOP = {"tok_emb.weight": "wte.weight", "pos_emb.weight": "wpe.weight",
        "ln_f.weight": "ln_f.weight", "ln_f.bias": "ln_f.bias"}

# Hugging Face activation names sheepop computes the same function for, and the name each of
# sheepop's activations is exported as.
HF_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                  "gelu_fast": "gelu_tanh", "gelu": "gelu", "relu": "relu", "relu2": "relu2"}
EXPORTED_ACTIVATION = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu", "relu2": "relu2"}
# Position kinds GPT-2's wpe table holds: its own learned table, or the fixed sinusoidal one.
EXPORTED_POSITIONS = ("learned", "sinusoidal")


def _name_map(n_layer: int) -> dict[str, str]:
    names = {ours: f"transformer.{hf}" for ours, hf in _TOP.items()}
    for i in range(n_layer):
        for ours, hf in _BLOCK.items():
            names[f"blocks.{i}.{ours}"] = f"transformer.h.{i}.{hf}"
    return names


def _is_conv1d(name: str) -> bool:
    return name.split(".", 2)[-1] in _CONV1D if name.startswith("blocks.") else False


# ----- export ---------------------------------------------------------------------------------

def check_gpt2_shaped(cfg: ModelConfig) -> None:
    """Raise a UserError naming the first setting that makes the model not GPT-2."""
    problems = [
        (cfg.pos_encoding in EXPORTED_POSITIONS, f"model.pos_encoding={cfg.pos_encoding} "
         "(GPT-2 adds a position table to the embeddings: learned or sinusoidal)"),
        (cfg.activation in EXPORTED_ACTIVATION, f"model.activation={cfg.activation} (GPT-2's "
         f"are {', '.join(EXPORTED_ACTIVATION)})"),
        (cfg.tie_weights, "model.tie_weights=false (GPT-2's head is the token embedding)"),
        *settings_neither_has(cfg, "GPT-2"),
        (cfg.bias, "model.bias=false (GPT-2 has biases in every linear layer)"),
        (cfg.norm == "layernorm", f"model.norm={cfg.norm} (GPT-2 uses layernorm)"),
        (cfg.ffn == "mlp", f"model.ffn={cfg.ffn} (GPT-2's feed-forward is the two-layer mlp)"),
        (cfg.n_kv_head in (0, cfg.n_head), f"model.n_kv_head={cfg.n_kv_head} (GPT-2 has one "
         "key/value head per query head)"),
    ]
    refuse_first(problems, "GPT-2")


def hf_config(cfg: ModelConfig, bos_id: int | None = None, eos_id: int | None = None
              ) -> dict[str, Any]:
    """The config.json of a Hugging Face GPT2LMHeadModel with `cfg`'s shape."""
    check_gpt2_shaped(cfg)
    return {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "vocab_size": cfg.vocab_size, "n_positions": cfg.block_size, "n_embd": cfg.n_embd,
        "n_layer": cfg.n_layer, "n_head": cfg.n_head,
        "n_inner": cfg.d_ff if cfg.d_ff and cfg.d_ff != 4 * cfg.n_embd else None,
        "activation_function": EXPORTED_ACTIVATION[cfg.activation],
        "layer_norm_epsilon": cfg.ln_eps,
        "resid_pdrop": cfg.dropout, "embd_pdrop": cfg.dropout, "attn_pdrop": cfg.dropout,
        "initializer_range": 0.02, "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
        "add_cross_attention": False, "tie_word_embeddings": True, "use_cache": True,
        "bos_token_id": bos_id, "eos_token_id": eos_id, "dtype": "float32",
    }


def to_hf_weights(weights: Weights, cfg: ModelConfig) -> Weights:
    """sheepop weights -> GPT2LMHeadModel's state dict (float32; the tied head not stored)."""
    check_gpt2_shaped(cfg)
    if cfg.pos_encoding == "sinusoidal":
        table = sinusoidal_table(cfg.block_size, cfg.n_embd) * cfg.sinusoid_scale
        weights = {**weights, "pos_emb.weight": table.astype(np.float32)}
    names = _name_map(cfg.n_layer)
    missing = sorted(set(names) - set(weights))
    if missing:
        raise UserError(f"the checkpoint lacks {missing[0]} (does it match its config?)")
    out = {}
    for ours, hf in names.items():
        w = np.asarray(weights[ours], dtype=np.float32)
        out[hf] = np.ascontiguousarray(w.T if _is_conv1d(ours) else w)
    return out


# ----- import ---------------------------------------------------------------------------------

def model_config_from_hf(hf: dict[str, Any], where: str) -> ModelConfig:
    """sheepop's ModelConfig for a Hugging Face GPT-2 config.json (refusing what differs)."""
    if hf.get("model_type") != "gpt2":
        raise UserError(f"{where}: model_type is {hf.get('model_type')!r}, not 'gpt2'")
    unsupported = [
        (not hf.get("scale_attn_weights", True), "scale_attn_weights=false"),
        (hf.get("scale_attn_by_inverse_layer_idx", False), "scale_attn_by_inverse_layer_idx"),
        (hf.get("add_cross_attention", False), "add_cross_attention"),
    ]
    for bad, setting in unsupported:
        if bad:
            raise UserError(f"{where}: GPT-2 variant with {setting} is not supported")
    act = hf.get("activation_function", "gelu_new")
    if act not in HF_ACTIVATIONS:
        raise UserError(f"{where}: activation_function {act!r} is not supported (known: "
                        f"{', '.join(HF_ACTIVATIONS)})")
    try:
        n_embd, n_inner = int(hf["n_embd"]), hf.get("n_inner")
        return ModelConfig(
            vocab_size=int(hf["vocab_size"]), block_size=int(hf["n_positions"]),
            n_layer=int(hf["n_layer"]), n_head=int(hf["n_head"]), n_embd=n_embd,
            d_ff=int(n_inner) if n_inner else 0, dropout=float(hf.get("resid_pdrop", 0.0)),
            pos_encoding="learned", activation=HF_ACTIVATIONS[act],
            ln_eps=float(hf.get("layer_norm_epsilon", 1e-5)), bias=True,
            tie_weights=bool(hf.get("tie_word_embeddings", True)), head_bias=False)
    except KeyError as e:
        raise UserError(f"{where}: config.json lacks {e.args[0]!r}") from None
    except (TypeError, ValueError) as e:
        raise UserError(f"{where}: config.json has a bad value ({e})") from None


def hf_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """sheepop name -> the shape of its GPT-2 tensor (Conv1D weights stored (in, out))."""
    d, f, V = cfg.n_embd, cfg.ffn_dim, cfg.vocab_size
    shapes = {"tok_emb.weight": (V, d), "pos_emb.weight": (cfg.block_size, d),
              "ln_f.weight": (d,), "ln_f.bias": (d,)}
    block = {"ln1.weight": (d,), "ln1.bias": (d,), "ln2.weight": (d,), "ln2.bias": (d,),
             "attn.qkv.weight": (d, 3 * d), "attn.qkv.bias": (3 * d,),
             "attn.proj.weight": (d, d), "attn.proj.bias": (d,),
             "ffn.fc.weight": (d, f), "ffn.fc.bias": (f,),
             "ffn.proj.weight": (f, d), "ffn.proj.bias": (d,)}
    for i in range(cfg.n_layer):
        shapes.update({f"blocks.{i}.{k}": v for k, v in block.items()})
    return shapes


def from_hf_weights(state: Weights, cfg: ModelConfig, where: str) -> tuple[ModelConfig, Weights]:
    """GPT-2 state dict (with or without the `transformer.` prefix) -> sheepop weights.

    An `lm_head.weight` equal to the embedding (or absent) is the tied head; a different one
    becomes sheepop's untied `head.weight`, and the config says so.
    """
    state = {(k if k.startswith(("transformer.", "lm_head.")) else f"transformer.{k}"): v
             for k, v in state.items()
             if not k.endswith((".attn.bias", ".attn.masked_bias"))}  # old causal-mask buffers
    names = _name_map(cfg.n_layer)
    missing = sorted(set(names.values()) - set(state))
    if missing:
        raise UserError(f"{where}: the weights lack {missing[0]}")
    shapes = hf_shapes(cfg)
    if "lm_head.weight" in state:
        names["head.weight"] = "lm_head.weight"
        shapes["head.weight"] = shapes["tok_emb.weight"]
    for ours, hf in names.items():
        if tuple(state[hf].shape) != shapes[ours]:
            raise UserError(f"{where}: {hf} has shape {tuple(state[hf].shape)}, the config says "
                            f"{shapes[ours]}")
    names.pop("head.weight", None)
    weights = {}
    for ours, hf in names.items():
        w = np.asarray(state[hf], dtype=np.float32)
        weights[ours] = np.ascontiguousarray(w.T if _is_conv1d(ours) else w)
    head = state.get("lm_head.weight")
    tied = head is None or np.array_equal(np.asarray(head, dtype=np.float32),
                                          weights["tok_emb.weight"])
    if not tied:
        weights["head.weight"] = np.ascontiguousarray(np.asarray(head, dtype=np.float32))
    cfg = dataclasses.replace(cfg, tie_weights=tied)
    unexpected = sorted(set(state) - set(names.values()) - {"lm_head.weight"})
    if unexpected:
        raise UserError(f"{where}: unexpected weight {unexpected[0]} (not a plain GPT-2?)")
    return cfg, weights
