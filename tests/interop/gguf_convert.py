"""Small GGUF files for the tests, written from a `transformers` model the way llama.cpp's
convert_hf_to_gguf.py writes them: the reference that sheepop's GGUF reader is tested against.

llama (LlamaModel.modify_tensors): q and k rows permuted from Hugging Face's rotate-half order
back to the original interleaved one, `permute` below; every other tensor renamed only; no
output.weight when the head is tied. gpt2 (GPT2Model.modify_tensors): the Conv1D weights (stored
(in, out)) transposed to (out, in), and output.weight written as a copy of the embedding. Norms and
other vectors are float32; matrices float32 or the type asked for.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize


def permute(w: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: within each head, row (half, i) of the
    rotate-half order goes to row (i, half), i.e. row 2i + half."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


_LLAMA_LAYER = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
                "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
                "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
_GPT2_LAYER = {"ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output",
               "ln_2": "ffn_norm", "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}
_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def llama_tensors(model) -> dict[str, np.ndarray]:
    c = model.config
    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    out = {"token_embd.weight": state["model.embed_tokens.weight"],
           "output_norm.weight": state["model.norm.weight"]}
    if not c.tie_word_embeddings:
        out["output.weight"] = state["lm_head.weight"]
    for i in range(c.num_hidden_layers):
        for hf, gg in _LLAMA_LAYER.items():
            w = state[f"model.layers.{i}.{hf}.weight"]
            if gg == "attn_q":
                w = permute(w, c.num_attention_heads, c.num_attention_heads)
            elif gg == "attn_k":
                w = permute(w, c.num_attention_heads, c.num_key_value_heads)
            out[f"blk.{i}.{gg}.weight"] = w
    return out


def llama_meta(model) -> dict[str, Any]:
    c = model.config
    head_dim = c.hidden_size // c.num_attention_heads
    theta = (getattr(c, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
    return {"llama.context_length": c.max_position_embeddings,
            "llama.embedding_length": c.hidden_size, "llama.block_count": c.num_hidden_layers,
            "llama.feed_forward_length": c.intermediate_size,
            "llama.rope.dimension_count": head_dim,
            "llama.attention.head_count": c.num_attention_heads,
            "llama.attention.head_count_kv": c.num_key_value_heads,
            "llama.attention.layer_norm_rms_epsilon": float(c.rms_norm_eps),
            "llama.rope.freq_base": float(theta), "llama.vocab_size": c.vocab_size}


def gpt2_tensors(model) -> dict[str, np.ndarray]:
    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    out = {"token_embd.weight": state["transformer.wte.weight"],
           "position_embd.weight": state["transformer.wpe.weight"],
           "output_norm.weight": state["transformer.ln_f.weight"],
           "output_norm.bias": state["transformer.ln_f.bias"],
           "output.weight": state["transformer.wte.weight"]}  # GPT-2's tied head, written out
    for i in range(model.config.n_layer):
        for hf, gg in _GPT2_LAYER.items():
            for p in ("weight", "bias"):
                w = state[f"transformer.h.{i}.{hf}.{p}"]
                out[f"blk.{i}.{gg}.{p}"] = w.T if f"{hf}.{p}" in _CONV1D else w
    return out


def gpt2_meta(model) -> dict[str, Any]:
    c = model.config
    return {"gpt2.context_length": c.n_positions, "gpt2.embedding_length": c.n_embd,
            "gpt2.feed_forward_length": c.n_inner or 4 * c.n_embd,
            "gpt2.block_count": c.n_layer, "gpt2.attention.head_count": c.n_head,
            "gpt2.attention.layer_norm_epsilon": float(c.layer_norm_epsilon)}


def write_gguf(path, arch: str, meta: dict[str, Any], tensors: dict[str, np.ndarray],
               matrix_type: GGMLQuantizationType = GGMLQuantizationType.F32) -> None:
    """One GGUF file: general.architecture `arch`, `meta` (ints as uint32, floats as float32,
    lists of strings / ints / floats as arrays), vectors in F32 and matrices in `matrix_type`;
    a float64 array is written as it is (F64: a type sheepop refuses)."""
    writer = GGUFWriter(path, arch)
    writer.add_name("test model")
    for key, value in meta.items():
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        else:
            writer.add_array(key, list(value))
    for name, w in tensors.items():
        if w.dtype == np.float64:
            writer.add_tensor(name, w)
            continue
        w = np.ascontiguousarray(w, dtype=np.float32)
        qtype = GGMLQuantizationType.F32 if w.ndim == 1 else matrix_type
        writer.add_tensor(name, quantize(w, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
