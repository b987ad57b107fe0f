"""LoRA adapters in the layout of Hugging Face PEFT: `adapter_config.json` and
`adapter_model.safetensors`, for a base model exported with `sheepop.interop.export_hf`, so that

    model = AutoModelForCausalLM.from_pretrained(hf_dir)
    model = peft.PeftModel.from_pretrained(model, adapter_dir)

computes what sheepop's model with the adapters computes. PEFT's LoRA layer is sheepop's,
y = x W^T + b + (lora_alpha / r) (x A^T) B^T with lora_A.weight (r, in) and lora_B.weight
(out, r), so each adapter maps to a module of the exported model:

    sheepop                 hf-llama (LlamaForCausalLM)           hf-gpt2 (GPT2LMHeadModel)
    blocks.{i}.attn.qkv     model.layers.{i}.self_attn.q/k/v_proj transformer.h.{i}.attn.c_attn
    blocks.{i}.attn.proj    model.layers.{i}.self_attn.o_proj     transformer.h.{i}.attn.c_proj
    blocks.{i}.ffn.gate/up  model.layers.{i}.mlp.gate/up_proj     -
    blocks.{i}.ffn.fc       -                                     transformer.h.{i}.mlp.c_fc
    blocks.{i}.ffn.proj     model.layers.{i}.mlp.down_proj        transformer.h.{i}.mlp.c_proj

Llama splits the fused qkv: the update s B A has rows [Q; K; V] like the weight, and row block
B_q A of it is the update of q_proj, so q_proj, k_proj and v_proj each get the same A and their
rows of B. The rows of q and k are renumbered into Hugging Face's rotate-half order exactly as
the weights are (sheepop.interop.llama). GPT-2's layers are Conv1Ds (weights stored (in, out));
PEFT keeps A and B in the nn.Linear orientation for them too and transposes only when merging,
which `fan_in_fan_out: true` tells it, so the adapters are written as they are.

The added tokens' trained rows (sheepop.arch.lora.NEW_ROWS) are PEFT's `trainable_token_indices`:
the ids V-n..V-1, whose rows `{embedding}.token_adapter.trainable_tokens_delta` holds whole (PEFT
writes them over the base rows, as sheepop does). A tied head follows the embedding in both; an
untied one gets its own rows under `lm_head`. PEFT has no such rows for a head bias (neither
export format has one).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from sheepop.arch.lora import NEW_ROWS, LoraConfig, check_adapters, target_modules
from sheepop.config.schema import ModelConfig
from sheepop.errors import UserError
from sheepop.interop.hf import ARCHITECTURES
from sheepop.interop.hf_files import write_json, write_safetensors
from sheepop.interop.llama import to_rotate_half

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"

# sheepop module (under blocks.{i}.) -> the Hugging Face modules it becomes, per format.
_LLAMA = {"attn.qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
          "attn.proj": ("self_attn.o_proj",), "ffn.gate": ("mlp.gate_proj",),
          "ffn.up": ("mlp.up_proj",), "ffn.proj": ("mlp.down_proj",)}
_GPT2 = {"attn.qkv": "attn.c_attn", "attn.proj": "attn.c_proj", "ffn.fc": "mlp.c_fc",
         "ffn.proj": "mlp.c_proj"}
_PREFIX = "base_model.model."  # what PeftModel.save_pretrained writes before a module's path
_EMBEDDING = {"hf-llama": "model.embed_tokens", "hf-gpt2": "transformer.wte"}
_TOKEN_ROWS = ".token_adapter.trainable_tokens_delta"


def _split(prefix: str) -> tuple[int, str]:
    """"blocks.3.attn.qkv" -> (3, "attn.qkv")."""
    _, layer, module = prefix.split(".", 2)
    return int(layer), module


def peft_weights(adapters: dict[str, np.ndarray], lora: LoraConfig, cfg: ModelConfig,
                 format: str) -> dict[str, np.ndarray]:
    """sheepop adapters -> the tensors of adapter_model.safetensors (float32)."""
    out: dict[str, np.ndarray] = {}
    rows = {"tok_emb.new_rows": _EMBEDDING[format], "head.new_rows": "lm_head"}
    for name, module in rows.items():
        if name in adapters:
            out[f"{_PREFIX}{module}{_TOKEN_ROWS}"] = np.ascontiguousarray(
                adapters[name], dtype=np.float32)
    prefixes = sorted({name.rsplit(".", 1)[0] for name in adapters if name not in NEW_ROWS})
    for prefix in prefixes:
        i, module = _split(prefix)
        a = np.asarray(adapters[f"{prefix}.lora_A"], dtype=np.float32)
        b = np.asarray(adapters[f"{prefix}.lora_B"], dtype=np.float32)
        if format == "hf-gpt2":
            pieces = {f"transformer.h.{i}.{_GPT2[module]}": b}
        elif module == "attn.qkv":
            H, Hkv, dk = cfg.n_head, cfg.kv_heads, cfg.head_dim
            bq, bk, bv = np.split(b, [H * dk, (H + Hkv) * dk])
            names = (f"model.layers.{i}.{m}" for m in _LLAMA[module])
            pieces = dict(zip(names, (to_rotate_half(bq, H, dk), to_rotate_half(bk, Hkv, dk),
                                      bv)))
        else:
            pieces = {f"model.layers.{i}.{_LLAMA[module][0]}": b}
        for path, b_rows in pieces.items():
            out[f"{_PREFIX}{path}.lora_A.weight"] = np.ascontiguousarray(a)
            out[f"{_PREFIX}{path}.lora_B.weight"] = np.ascontiguousarray(b_rows)
    return out


def target_names(lora: LoraConfig, cfg: ModelConfig, format: str) -> list[str]:
    """PEFT's target_modules: the module names (matched as suffixes of module paths) that
    carry adapters. GPT-2's two c_proj are told apart by their parent (attn. / mlp.)."""
    modules = [m for t in lora.targets for m in target_modules(cfg, t)]
    if format == "hf-gpt2":
        return [_GPT2[m] for m in modules]
    return [name.split(".")[-1] for m in modules for name in _LLAMA[m]]


def token_indices(lora: LoraConfig, cfg: ModelConfig, format: str
                  ) -> list[int] | dict[str, list[int]] | None:
    """PEFT's trainable_token_indices: the new tokens' ids for the embedding (which a tied head
    follows), or per module when the head is untied; None without new tokens."""
    if lora.new_tokens == 0:
        return None
    ids = list(range(cfg.vocab_size - lora.new_tokens, cfg.vocab_size))
    if cfg.tie_weights:
        return ids
    return {_EMBEDDING[format].rsplit(".", 1)[1]: ids, "lm_head": ids}


def peft_config(lora: LoraConfig, cfg: ModelConfig, format: str,
                base_model: str | None = None) -> dict[str, Any]:
    """adapter_config.json: a LoRA of rank r and alpha (PEFT's scale lora_alpha / r, the same
    s), no dropout, no trained biases, and the new tokens' rows as trainable_token_indices."""
    return {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model,
        "r": lora.rank, "lora_alpha": lora.alpha, "lora_dropout": 0.0,
        "target_modules": target_names(lora, cfg, format),
        "fan_in_fan_out": format == "hf-gpt2", "bias": "none", "use_rslora": False,
        "use_dora": False, "init_lora_weights": True, "inference_mode": True,
        "modules_to_save": None, "layers_to_transform": None, "rank_pattern": {},
        "alpha_pattern": {}, "trainable_token_indices": token_indices(lora, cfg, format),
    }


def export_peft(adapters: dict[str, np.ndarray], lora: LoraConfig, cfg: ModelConfig,
                out_dir: str | Path, format: str, base_model: str | None = None) -> None:
    """Write `adapters` (a LoRA run's, checked against `lora` and `cfg`) into `out_dir` as a
    PEFT adapter for the model `export_hf(..., format)` writes; `base_model` goes into
    base_model_name_or_path (e.g. the exported model's directory)."""
    if format not in ARCHITECTURES:
        raise UserError(f"unknown export format {format!r} (known: {', '.join(ARCHITECTURES)})")
    ARCHITECTURES[format].check_shaped(cfg)
    check_adapters(cfg, lora, adapters, "the adapters")
    if "head.new_bias" in adapters:
        raise UserError("PEFT cannot hold trained rows of a head bias")
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"output path exists and is not a directory: {out_dir}")
    tensors = peft_weights(adapters, lora, cfg, format)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_safetensors(out_dir / WEIGHTS_FILE, tensors)
    write_json(out_dir / CONFIG_FILE, peft_config(lora, cfg, format, base_model))
