"""A GGUF file's metadata as sheepop's model settings, and back (for the export).

llama.cpp names each setting `{arch}.{field}` (arch = general.architecture). Every field of the
two architectures sheepop reads is honoured, checked to hold the one value sheepop computes, or
refused by name:

    field                                  sheepop
    block_count                            model.n_layer
    context_length                         model.block_size
    embedding_length                       model.n_embd
    feed_forward_length                    model.d_ff
    attention.head_count / head_count_kv   model.n_head / n_kv_head (0 when equal)
    attention.layer_norm_rms_epsilon       model.ln_eps (llama: rmsnorm)
    attention.layer_norm_epsilon           model.ln_eps (gpt2: layernorm)
    rope.freq_base                         model.rope_theta (llama.cpp's default 10000)
    vocab_size                             model.vocab_size (checked against token_embd)
    rope.dimension_count, attention.key_length / value_length    must be the head width
    rope.scaling.type (none), rope.scaling.factor (1), expert_count (0), sliding_window (at
    least the context), logit softcapping, logit/embedding/residual/attention scales: refused
    unless they leave the model unchanged.

Any other `{arch}.` field is refused too: sheepop cannot know that it leaves the result alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sheepop.config.layer_kinds import GATE_ACTIVATION
from sheepop.config.schema import ModelConfig
from sheepop.errors import UserError

DEFAULT_THETA = 10000.0  # llama.cpp's rope.freq_base when the file has none

# Fields that change nothing while they hold their neutral value: field -> (neutral test, why).
_NEUTRAL: dict[str, tuple[Any, str]] = {
    "rope.scaling.type": (lambda v: v in ("none", ""), "sheepop's rope has no scaling"),
    "rope.scaling.factor": (lambda v: v in (0.0, 1.0), "sheepop's rope has no scaling"),
    "rope.scale_linear": (lambda v: v in (0.0, 1.0), "sheepop's rope has no scaling"),
    "rope.scaling.attn_factor": (lambda v: v == 1.0, "sheepop's rope has no scaling"),
    "rope.scaling.original_context_length": (lambda v: True, ""),  # only read with scaling
    "rope.scaling.finetuned": (lambda v: True, ""),
    "expert_count": (lambda v: v == 0, "mixture-of-experts feed-forwards are not supported"),
    "expert_used_count": (lambda v: v == 0, "mixture-of-experts feed-forwards are not "
                                            "supported"),
    "attn_logit_softcapping": (lambda v: v == 0.0, "sheepop does not cap attention logits"),
    "final_logit_softcapping": (lambda v: v == 0.0, "sheepop does not cap the output logits"),
    "logit_scale": (lambda v: v == 1.0, "sheepop does not scale the output logits"),
    "embedding_scale": (lambda v: v == 1.0, "sheepop does not scale the embeddings"),
    "residual_scale": (lambda v: v == 1.0, "sheepop does not scale the residual branches"),
    "attention.causal": (lambda v: v is True, "sheepop's attention is causal"),
    "attention.clamp_kqv": (lambda v: v == 0.0, "sheepop does not clamp q, k and v"),
    "attention.max_alibi_bias": (lambda v: v == 0.0, "sheepop has no ALiBi"),
    "tensor_data_layout": (lambda v: v == "Meta AI original pth", "an unknown layout"),
}
# Fields a llama model's config is made of (read below); gpt2's differ in the norm.
_LLAMA_FIELDS = {"vocab_size", "context_length", "embedding_length", "block_count",
                 "feed_forward_length", "attention.head_count", "attention.head_count_kv",
                 "attention.layer_norm_rms_epsilon", "rope.freq_base", "rope.dimension_count",
                 "attention.key_length", "attention.value_length", "attention.sliding_window"}
_GPT2_FIELDS = {"vocab_size", "context_length", "embedding_length", "block_count",
                "feed_forward_length", "attention.head_count", "attention.head_count_kv",
                "attention.layer_norm_epsilon", "attention.key_length",
                "attention.value_length"}
FIELDS = {"llama": _LLAMA_FIELDS, "gpt2": _GPT2_FIELDS}


def _fields(meta: Mapping[str, Any], arch: str, where: str) -> dict[str, Any]:
    """The `{arch}.` fields without their prefix, each one known, and neutral where it must be."""
    prefix = f"{arch}."
    fields = {k[len(prefix):]: v for k, v in meta.items() if k.startswith(prefix)}
    for name, value in fields.items():
        if name in FIELDS[arch]:
            continue
        if name not in _NEUTRAL:
            raise UserError(f"{where}: {prefix}{name} = {value!r} is a field sheepop does not "
                            "know, so it cannot tell whether it changes the model")
        neutral, why = _NEUTRAL[name]
        if not neutral(value):
            raise UserError(f"{where}: {prefix}{name} = {value!r} is not supported ({why})")
    return fields


def _int(fields: Mapping[str, Any], name: str, arch: str, where: str,
         default: int | None = None) -> int:
    value = fields.get(name, default)
    if value is None:
        raise UserError(f"{where}: the metadata lacks {arch}.{name}")
    if isinstance(value, list):  # llama.cpp allows one value per layer
        if len(set(value)) != 1:
            raise UserError(f"{where}: {arch}.{name} differs between layers ({value[:4]}...), "
                            "which sheepop does not support")
        value = value[0]
    if isinstance(value, bool) or not isinstance(value, int):
        raise UserError(f"{where}: {arch}.{name} is {value!r}, not an integer")
    return value


def model_config_from_gguf(meta: Mapping[str, Any], where: str, vocab_rows: int) -> ModelConfig:
    """sheepop's ModelConfig for a GGUF file's metadata (`vocab_rows`: the rows of its
    token_embd, which a vocab_size field must equal); a field it cannot compute is refused."""
    arch = meta.get("general.architecture")
    if arch not in FIELDS:
        raise UserError(f"{where}: unexpected architecture {arch!r}")
    f = _fields(meta, arch, where)
    d, n_head = _int(f, "embedding_length", arch, where), _int(f, "attention.head_count", arch,
                                                               where)
    n_kv = _int(f, "attention.head_count_kv", arch, where, default=n_head)
    if n_head < 1 or d % n_head:
        raise UserError(f"{where}: {arch}.embedding_length={d} is not a multiple of "
                        f"{arch}.attention.head_count={n_head}")
    if n_kv < 1 or n_head % n_kv:
        raise UserError(f"{where}: {arch}.attention.head_count={n_head} is not a multiple of "
                        f"{arch}.attention.head_count_kv={n_kv}")
    head_dim = d // n_head
    for name in ("rope.dimension_count", "attention.key_length", "attention.value_length"):
        if name in f and _int(f, name, arch, where) != head_dim:
            raise UserError(f"{where}: {arch}.{name}={f[name]} is not supported (sheepop's "
                            f"heads are embedding_length / head_count = {head_dim} wide, and "
                            "rope turns all of a head)")
    vocab = _int(f, "vocab_size", arch, where, default=vocab_rows)
    if vocab != vocab_rows:
        raise UserError(f"{where}: {arch}.vocab_size={vocab} but token_embd.weight has "
                        f"{vocab_rows} rows")
    context = _int(f, "context_length", arch, where)
    window = f.get("attention.sliding_window", 0)
    if window and window < context:
        raise UserError(f"{where}: {arch}.attention.sliding_window={window} is not supported "
                        f"(sheepop attends over the whole context of {context})")
    common = dict(vocab_size=vocab, block_size=context, n_layer=_int(f, "block_count", arch,
                                                                       where),
                  n_head=n_head, n_kv_head=0 if n_kv == n_head else n_kv, n_embd=d,
                  d_ff=_int(f, "feed_forward_length", arch, where), dropout=0.0)
    if arch == "gpt2":
        eps = f.get("attention.layer_norm_epsilon", 1e-5)
        return ModelConfig(**common, pos_encoding="learned", activation="gelu_tanh",
                           norm="layernorm", ffn="mlp", ln_eps=float(eps), bias=True,
                           tie_weights=True, head_bias=False)
    if "attention.layer_norm_rms_epsilon" not in f:
        raise UserError(f"{where}: the metadata lacks {arch}.attention.layer_norm_rms_epsilon")
    return ModelConfig(**common, pos_encoding="rope",
                       rope_theta=float(f.get("rope.freq_base", DEFAULT_THETA)),
                       norm="rmsnorm", ffn="swiglu", activation=GATE_ACTIVATION["swiglu"],
                       ln_eps=float(f["attention.layer_norm_rms_epsilon"]), bias=False,
                       tie_weights=True, head_bias=False)


def llama_metadata(cfg: ModelConfig) -> dict[str, Any]:
    """The `llama.` fields llama.cpp reads for a Llama-shaped sheepop model (the inverse of
    `model_config_from_gguf`); integers are written as uint32, floats as float32."""
    return {
        "llama.vocab_size": cfg.vocab_size, "llama.context_length": cfg.block_size,
        "llama.embedding_length": cfg.n_embd, "llama.block_count": cfg.n_layer,
        "llama.feed_forward_length": cfg.ffn_dim, "llama.attention.head_count": cfg.n_head,
        "llama.attention.head_count_kv": cfg.kv_heads,
        "llama.attention.layer_norm_rms_epsilon": float(cfg.ln_eps),
        "llama.rope.freq_base": float(cfg.rope_theta),
        "llama.rope.dimension_count": cfg.head_dim,
    }
