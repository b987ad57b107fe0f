"""An imported SwiGLU model's config says what runs (issue 41, section 4: SmolLM2 imported from
GGUF wrote "activation": "gelu", the default, while its feed-forward computes silu's gate):
both importers of Llama-shaped models, GGUF metadata and a Hugging Face config.json."""

from __future__ import annotations

from sheepop.interop.gguf_config import model_config_from_gguf
from sheepop.interop.llama import model_fields_from_hf

GGUF_LLAMA = {"general.architecture": "llama", "llama.embedding_length": 64,
              "llama.attention.head_count": 4, "llama.attention.head_count_kv": 2,
              "llama.context_length": 128, "llama.block_count": 2,
              "llama.feed_forward_length": 160, "llama.attention.layer_norm_rms_epsilon": 1e-5}
HF_LLAMA = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
            "num_key_value_heads": 2, "num_hidden_layers": 2, "intermediate_size": 160,
            "vocab_size": 100, "hidden_act": "silu"}


def test_a_gguf_llama_is_swiglu_with_silu():
    cfg = model_config_from_gguf(GGUF_LLAMA, "model.gguf", vocab_rows=100)
    assert (cfg.ffn, cfg.activation) == ("swiglu", "silu")


def test_a_hugging_face_llama_is_swiglu_with_silu():
    fields = model_fields_from_hf(HF_LLAMA, "config.json")
    assert (fields["ffn"], fields["activation"]) == ("swiglu", "silu")
