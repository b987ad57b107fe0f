"""Llama's weights and config in Hugging Face's layout, to and from sheepop's.

A sheepop model with rotary positions, RMSNorm, a SwiGLU feed-forward, no biases and no head
bias is Llama (grouped-query attention through `model.n_kv_head`, the head tied or not). The
names map one to one, except that sheepop fuses Q, K and V into one matrix:

    sheepop                              Hugging Face LlamaForCausalLM
    tok_emb.weight                       model.embed_tokens.weight
    blocks.{i}.ln1 / ln2                 model.layers.{i}.input_layernorm / post_attention_layernorm
    blocks.{i}.attn.qkv  rows [Q; K; V]  model.layers.{i}.self_attn.q_proj / k_proj / v_proj
    blocks.{i}.attn.proj                 model.layers.{i}.self_attn.o_proj
    blocks.{i}.ffn.gate / up / proj      model.layers.{i}.mlp.gate_proj / up_proj / down_proj
    ln_f                                 model.norm
    head.weight (untied only)            lm_head.weight

Both libraries rotate each head's query and key by the same angles pos * theta^(-2i/dk), but
pair the coordinates differently: sheepop rotates the interleaved pairs (2i, 2i+1), Hugging Face
the halves (i, i + dk/2) ("rotate_half"). Renumbering the rows of every q and k head,
HF row j = sheepop row perm[j] with perm = [0, 2, ..., dk-2, 1, 3, ..., dk-1], turns one rule into
the other; scores q.k are sums over the coordinates, which a common renumbering of q and k leaves
unchanged, so the models compute the same function. V and every other matrix keep their rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sheepop.config.layer_kinds import GATE_ACTIVATION
from sheepop.config.schema import ModelConfig
from sheepop.errors import UserError
from sheepop.files import shown
from sheepop.interop.export_checks import refuse_first, settings_neither_has

Weights = dict[str, np.ndarray]

# sheepop name -> Hugging Face name, per block (attn.qkv is split into q/k/v, below).
_BLOCK = {
    "ln1.weight": "input_layernorm.weight", "ln2.weight": "post_attention_layernorm.weight",
    "attn.proj.weight": "self_attn.o_proj.weight", "ffn.gate.weight": "mlp.gate_proj.weight",
    "ffn.up.weight": "mlp.up_proj.weight", "ffn.proj.weight": "mlp.down_proj.weight",
}
_QKV = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight")
_TOP = {"tok_emb.weight": "model.embed_tokens.weight", "ln_f.weight": "model.norm.weight"}
DEFAULT_THETA = 10000.0


# ----- the rotary pairs -----------------------------------------------------------------------

def rotate_half_order(head_dim: int) -> np.ndarray:
    """perm with HF row j = sheepop row perm[j]: [0, 2, ..., dk-2, 1, 3, ..., dk-1]."""
    return np.concatenate([np.arange(0, head_dim, 2), np.arange(1, head_dim, 2)])


def to_rotate_half(w: np.ndarray, n_heads: int, head_dim: int) -> np.ndarray:
    """Rows of `n_heads` stacked heads (a q or k weight, or bias) renumbered within each head
    from sheepop's interleaved pairs to Hugging Face's halves."""
    heads = w.reshape(n_heads, head_dim, *w.shape[1:])
    return np.ascontiguousarray(heads[:, rotate_half_order(head_dim)].reshape(w.shape))


def from_rotate_half(w: np.ndarray, n_heads: int, head_dim: int) -> np.ndarray:
    """The inverse of `to_rotate_half` (sheepop row perm[j] = HF row j)."""
    heads = w.reshape(n_heads, head_dim, *w.shape[1:])
    return np.ascontiguousarray(heads[:, np.argsort(rotate_half_order(head_dim))]
                                .reshape(w.shape))


# ----- export ---------------------------------------------------------------------------------

def check_llama_shaped(cfg: ModelConfig) -> None:
    """Raise a UserError naming the first setting that makes the model not Llama."""
    problems = [
        (cfg.pos_encoding == "rope", f"model.pos_encoding={cfg.pos_encoding} (Llama has rotary "
         "positions: rope)"),
        (cfg.norm == "rmsnorm", f"model.norm={cfg.norm} (Llama uses rmsnorm)"),
        (cfg.ffn == "swiglu", f"model.ffn={cfg.ffn} (Llama's feed-forward is swiglu)"),
        (not cfg.bias, "model.bias=true (Llama has no biases)"),
        *settings_neither_has(cfg, "Llama"),
    ]
    refuse_first(problems, "Llama")


def hf_config(cfg: ModelConfig, bos_id: int | None = None, eos_id: int | None = None
              ) -> dict[str, Any]:
    """The config.json of a Hugging Face LlamaForCausalLM with `cfg`'s shape. The rotary base
    is written both as transformers 5 reads it (rope_parameters) and as earlier versions and
    other readers do (rope_theta, rope_scaling null)."""
    check_llama_shaped(cfg)
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.n_embd,
        "intermediate_size": cfg.ffn_dim, "num_hidden_layers": cfg.n_layer,
        "num_attention_heads": cfg.n_head, "num_key_value_heads": cfg.kv_heads,
        "head_dim": cfg.head_dim, "hidden_act": "silu",
        "max_position_embeddings": cfg.block_size, "rms_norm_eps": cfg.ln_eps,
        "rope_theta": cfg.rope_theta, "rope_scaling": None,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "attention_bias": False, "mlp_bias": False, "attention_dropout": 0.0,
        "tie_word_embeddings": cfg.tie_weights, "initializer_range": 0.02,
        "pretraining_tp": 1, "use_cache": True,
        "bos_token_id": bos_id, "eos_token_id": eos_id, "dtype": "float32",
    }


def hf_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of LlamaForCausalLM's state dict with `cfg`'s shape, and its shape."""
    d, f, V, dk = cfg.n_embd, cfg.ffn_dim, cfg.vocab_size, cfg.head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (V, d),
                                          "model.norm.weight": (d,)}
    for i in range(cfg.n_layer):
        block = {"input_layernorm.weight": (d,), "post_attention_layernorm.weight": (d,),
                 _QKV[0]: (cfg.n_head * dk, d), _QKV[1]: (cfg.kv_heads * dk, d),
                 _QKV[2]: (cfg.kv_heads * dk, d), "self_attn.o_proj.weight": (d, cfg.n_head * dk),
                 "mlp.gate_proj.weight": (f, d), "mlp.up_proj.weight": (f, d),
                 "mlp.down_proj.weight": (d, f)}
        shapes.update({f"model.layers.{i}.{k}": v for k, v in block.items()})
    if not cfg.tie_weights:
        shapes["lm_head.weight"] = (V, d)
    return shapes


def to_hf_weights(weights: Weights, cfg: ModelConfig) -> Weights:
    """sheepop weights -> LlamaForCausalLM's state dict (float32; a tied head not stored)."""
    check_llama_shaped(cfg)
    H, Hkv, dk = cfg.n_head, cfg.kv_heads, cfg.head_dim
    names = [*_TOP, *(f"blocks.{i}.{n}" for i in range(cfg.n_layer)
                      for n in ("attn.qkv.weight", *_BLOCK))]
    names += [] if cfg.tie_weights else ["head.weight"]
    missing = sorted(set(names) - set(weights))
    if missing:
        raise UserError(f"the checkpoint lacks {missing[0]} (does it match its config?)")
    w = {k: np.asarray(weights[k], dtype=np.float32) for k in names}
    out = {hf: w[ours] for ours, hf in _TOP.items()}
    for i in range(cfg.n_layer):
        ours, hf = f"blocks.{i}.", f"model.layers.{i}."
        out.update({hf + hf_name: w[ours + name] for name, hf_name in _BLOCK.items()})
        q, k, v = np.split(w[ours + "attn.qkv.weight"], [H * dk, (H + Hkv) * dk])
        out[hf + _QKV[0]] = to_rotate_half(q, H, dk)
        out[hf + _QKV[1]] = to_rotate_half(k, Hkv, dk)
        out[hf + _QKV[2]] = v
    if not cfg.tie_weights:
        out["lm_head.weight"] = w["head.weight"]
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


# ----- import ---------------------------------------------------------------------------------

def _rope_theta(hf: dict[str, Any], where: str) -> float:
    """The rotary base, refusing any scaling (sheepop's rope is the plain one). transformers 5
    writes rope_parameters {rope_type, rope_theta, ...}; older files rope_theta + rope_scaling."""
    if hf.get("rope_scaling") is not None:  # refused beside rope_parameters too: a reader
        # that knows only rope_scaling would scale
        raise UserError(f"{where}: rope_scaling is set ({shown(hf['rope_scaling'])}), which is "
                        "not supported (sheepop's rope has no scaling)")
    params = hf.get("rope_parameters")
    if params is not None:
        if not isinstance(params, dict):
            raise UserError(f"{where}: rope_parameters is not a JSON object")
        kind = params.get("rope_type", params.get("type", "default"))
        if kind != "default":
            raise UserError(f"{where}: rope_parameters.rope_type={kind!r} is not supported "
                            "(sheepop's rope has no scaling: only 'default')")
        if params.get("partial_rotary_factor", 1.0) != 1.0:
            raise UserError(f"{where}: rope_parameters.partial_rotary_factor is not supported "
                            "(sheepop rotates every coordinate of a head)")
        return float(params.get("rope_theta", hf.get("rope_theta", DEFAULT_THETA)))
    return float(hf.get("rope_theta", DEFAULT_THETA))


def model_fields_from_hf(hf: dict[str, Any], where: str) -> dict[str, Any]:
    """sheepop's [model] settings for a Hugging Face Llama config.json (refusing, by its field,
    what sheepop cannot compute: scaled rope, biases, another activation, another head width)."""
    if hf.get("model_type") != "llama":
        raise UserError(f"{where}: model_type is {hf.get('model_type')!r}, not 'llama'")
    for field in ("attention_bias", "mlp_bias"):
        if hf.get(field, False):
            raise UserError(f"{where}: {field}=true is not supported (sheepop's Llama has no "
                            "biases)")
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise UserError(f"{where}: hidden_act={act!r} is not supported (sheepop's swiglu uses "
                        "silu)")
    if hf.get("quantization_config") is not None:
        raise UserError(f"{where}: quantization_config is set (quantized weights are not "
                        "supported: use the float weights)")
    try:
        d, n_head = int(hf["hidden_size"]), int(hf["num_attention_heads"])
        head_dim = hf.get("head_dim")
        if head_dim is not None and int(head_dim) * n_head != d:
            raise UserError(f"{where}: head_dim={head_dim} is not supported (sheepop's heads "
                            f"are hidden_size / num_attention_heads = {d / n_head:g} wide)")
        kv = hf.get("num_key_value_heads")
        fields = {
            "vocab_size": int(hf["vocab_size"]),
            "block_size": int(hf.get("max_position_embeddings", 2048)),
            "n_layer": int(hf["num_hidden_layers"]), "n_head": n_head, "n_embd": d,
            "n_kv_head": 0 if kv is None or int(kv) == n_head else int(kv),  # 0: n_head
            "d_ff": int(hf["intermediate_size"]), "dropout": 0.0,
            "pos_encoding": "rope", "rope_theta": _rope_theta(hf, where),
            "norm": "rmsnorm", "ffn": "swiglu", "activation": GATE_ACTIVATION["swiglu"],
            "ln_eps": float(hf.get("rms_norm_eps", 1e-6)),
            "bias": False, "tie_weights": bool(hf.get("tie_word_embeddings", False)),
            "head_bias": False,
        }
    except KeyError as e:
        raise UserError(f"{where}: config.json lacks {e.args[0]!r}") from None
    except (TypeError, ValueError) as e:
        raise UserError(f"{where}: config.json has a bad value ({e})") from None
    if fields["n_kv_head"] and n_head % fields["n_kv_head"]:
        raise UserError(f"{where}: num_attention_heads={n_head} is not a multiple of "
                        f"num_key_value_heads={fields['n_kv_head']}")
    return fields


def model_config_from_hf(hf: dict[str, Any], where: str) -> ModelConfig:
    """sheepop's ModelConfig for a Hugging Face Llama config.json (`model_fields_from_hf`)."""
    return ModelConfig(**model_fields_from_hf(hf, where))


def from_hf_weights(state: Weights, cfg: ModelConfig, where: str) -> tuple[ModelConfig, Weights]:
    """LlamaForCausalLM's state dict -> sheepop weights, every tensor's shape checked against
    the config. With tie_word_embeddings the head is the embedding (an `lm_head.weight` stored
    beside it is ignored, as transformers ignores it)."""
    state = {k: v for k, v in state.items()
             if not k.endswith("rotary_emb.inv_freq")}  # a buffer old checkpoints stored
    shapes = hf_shapes(cfg)
    missing = sorted(set(shapes) - set(state))
    if missing:
        raise UserError(f"{where}: the weights lack {missing[0]}")
    unexpected = sorted(set(state) - set(shapes) - {"lm_head.weight"})
    if unexpected:
        raise UserError(f"{where}: unexpected weight {unexpected[0]} (not a plain Llama?)")
    for name, shape in shapes.items():
        if tuple(state[name].shape) != shape:
            raise UserError(f"{where}: {name} has shape {tuple(state[name].shape)}, the config "
                            f"says {shape}")
    s = {k: np.asarray(state[k], dtype=np.float32) for k in shapes}
    H, Hkv, dk = cfg.n_head, cfg.kv_heads, cfg.head_dim
    weights = {ours: s[hf] for ours, hf in _TOP.items()}
    for i in range(cfg.n_layer):
        ours, hf = f"blocks.{i}.", f"model.layers.{i}."
        weights.update({ours + name: s[hf + hf_name] for name, hf_name in _BLOCK.items()})
        q, k, v = (s[hf + n] for n in _QKV)
        weights[ours + "attn.qkv.weight"] = np.concatenate(
            [from_rotate_half(q, H, dk), from_rotate_half(k, Hkv, dk), v])
    if not cfg.tie_weights:
        weights["head.weight"] = s["lm_head.weight"]
    return cfg, {k: np.ascontiguousarray(v) for k, v in weights.items()}
