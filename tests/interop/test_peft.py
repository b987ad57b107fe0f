"""LoRA adapters exported in PEFT's layout: loaded by the `peft` package onto the model that
`export_hf` wrote, they give the logits of sheepop's model with the same adapters (Llama: the
fused qkv split into q/k/v_proj and the rotary rows renumbered; GPT-2: Conv1D layers)."""

import json

import numpy as np
import peft
import pytest
import torch
import transformers
from safetensors.numpy import load_file
from variants import ALL_LORA_TARGETS, gqa, llama

from sheepop.arch.lora import LoraConfig, adapter_shapes
from sheepop.checkpoint import format as checkpoint
from sheepop.config.schema import Config, ModelConfig
from sheepop.errors import UserError
from sheepop.interop import export_hf
from sheepop.interop.peft import CONFIG_FILE, WEIGHTS_FILE, export_peft
from sheepop.model import GPT, add_lora
from sheepop.scratch.init import init_params
from sheepop.tokenizers import train_tokenizer

T = 16
MODELS = {
    "hf-llama": ModelConfig(block_size=T, n_layer=2, n_embd=32, d_ff=48, rope_theta=500.0,
                            ln_eps=1e-5, **llama(**gqa(4, 2))),
    "hf-gpt2": ModelConfig(block_size=T, n_layer=2, n_head=4, n_embd=32, pos_encoding="learned",
                           activation="gelu_tanh", bias=True, tie_weights=True),
}


def base_run(tmp_path, fmt: str):
    """A run directory (random, O(0.1-1) weights, so no mapping mistake hides in tiny logits)
    exported to Hugging Face; its config, weights and the exported directory."""
    tok = train_tokenizer("char", ["abcdefghijklmnopqrstuvwxyz .,"])
    cfg = ModelConfig(**{**MODELS[fmt].__dict__, "vocab_size": tok.vocab_size})
    rng = np.random.default_rng(1)
    weights = {k: (v + rng.standard_normal(v.shape) * (0.3 if v.ndim > 1 else 0.1))
               .astype(np.float32) for k, v in init_params(cfg, 0).items()}
    config = Config()
    config.model = cfg
    checkpoint.save_checkpoint(tmp_path / "run", weights, config.to_dict(), tok.to_json())
    export_hf(tmp_path / "run", tmp_path / "hf", fmt)
    return cfg, weights, tmp_path / "hf"


def random_adapters(cfg: ModelConfig, lora: LoraConfig, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: (rng.standard_normal(s) * 0.3).astype(np.float32)
            for k, s in adapter_shapes(cfg, lora).items()}


def sheepop_logits(cfg, weights, lora, adapters, ids) -> np.ndarray:
    model = GPT(cfg)
    model.load_numpy_weights(weights)
    add_lora(model, lora, adapters).eval()
    with torch.no_grad():
        return model(torch.from_numpy(ids))[0].numpy()


@pytest.mark.parametrize("fmt,targets,new_tokens", [
    ("hf-llama", ALL_LORA_TARGETS, 0), ("hf-llama", ("qkv",), 0),
    ("hf-gpt2", ALL_LORA_TARGETS, 0), ("hf-gpt2", ("proj",), 0),
    ("hf-llama", ("qkv", "fc"), 3), ("hf-gpt2", ("qkv",), 3),  # untied and tied new rows
])
def test_peft_loads_the_adapters_with_the_same_logits(tmp_path, fmt, targets, new_tokens):
    cfg, weights, hf_dir = base_run(tmp_path, fmt)
    lora = LoraConfig(4, 8.0, targets, new_tokens=new_tokens)
    adapters = random_adapters(cfg, lora, 2)
    export_peft(adapters, lora, cfg, tmp_path / "adapter", fmt, str(hf_dir))
    ids = np.random.default_rng(3).integers(0, cfg.vocab_size, (2, T))
    ids[:, -4:] = cfg.vocab_size - 1  # a new token read (and, at every position, written)
    ours = sheepop_logits(cfg, weights, lora, adapters, ids)

    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    with torch.no_grad():
        base = hf(torch.from_numpy(ids)).logits.numpy()
    model = peft.PeftModel.from_pretrained(hf, tmp_path / "adapter").eval()
    with torch.no_grad():
        theirs = model(torch.from_numpy(ids)).logits.numpy()
    np.testing.assert_allclose(theirs, ours, rtol=0, atol=1e-4)
    assert np.abs(theirs - base).max() > 0.1  # the adapters were applied, not ignored


def test_the_files_name_each_module_as_peft_does(tmp_path):
    cfg = ModelConfig(**{**MODELS["hf-llama"].__dict__, "vocab_size": 20})
    lora = LoraConfig(2, 4.0, ("qkv", "down"))
    adapters = random_adapters(cfg, lora, 4)
    export_peft(adapters, lora, cfg, tmp_path, "hf-llama")
    config = json.loads((tmp_path / CONFIG_FILE).read_text())
    assert (config["peft_type"], config["r"], config["lora_alpha"], config["fan_in_fan_out"]) == (
        "LORA", 2, 4.0, False)
    assert config["target_modules"] == ["q_proj", "k_proj", "v_proj", "down_proj"]
    tensors = load_file(tmp_path / WEIGHTS_FILE)
    layer = "base_model.model.model.layers.1."
    assert {k for k in tensors if k.startswith(layer)} == {
        f"{layer}{m}.lora_{ab}.weight" for m in ("self_attn.q_proj", "self_attn.k_proj",
                                                 "self_attn.v_proj", "mlp.down_proj")
        for ab in "AB"}
    # q (4 heads of 8) and k (2 heads) rows renumbered within each head; v as it is
    b = adapters["blocks.1.attn.qkv.lora_B"]
    perm = [0, 2, 4, 6, 1, 3, 5, 7]
    np.testing.assert_array_equal(tensors[f"{layer}self_attn.q_proj.lora_B.weight"][:8], b[perm])
    np.testing.assert_array_equal(tensors[f"{layer}self_attn.k_proj.lora_B.weight"][8:],
                                  b[32:48][[8 + p for p in perm]])
    np.testing.assert_array_equal(tensors[f"{layer}self_attn.v_proj.lora_B.weight"], b[48:])
    for m in ("q_proj", "k_proj", "v_proj"):
        np.testing.assert_array_equal(tensors[f"{layer}self_attn.{m}.lora_A.weight"],
                                      adapters["blocks.1.attn.qkv.lora_A"])
    assert config["trainable_token_indices"] is None
    gpt2 = ModelConfig(**{**MODELS["hf-gpt2"].__dict__, "vocab_size": 20})
    with_rows = LoraConfig(2, 4.0, ALL_LORA_TARGETS, new_tokens=2)
    export_peft(random_adapters(gpt2, with_rows, 5), with_rows, gpt2, tmp_path / "gpt2",
                "hf-gpt2")
    config = json.loads((tmp_path / "gpt2" / CONFIG_FILE).read_text())
    assert config["fan_in_fan_out"] is True
    assert config["target_modules"] == ["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"]
    assert config["trainable_token_indices"] == [18, 19]  # the last two ids; the head is tied
    rows = load_file(tmp_path / "gpt2" / WEIGHTS_FILE)[
        "base_model.model.transformer.wte.token_adapter.trainable_tokens_delta"]
    assert rows.shape == (2, 32)


def test_refuses_what_the_format_cannot_hold(tmp_path):
    gpt2 = ModelConfig(**{**MODELS["hf-gpt2"].__dict__, "vocab_size": 20})
    lora = LoraConfig(2, 4.0, ALL_LORA_TARGETS)
    with pytest.raises(UserError, match="cannot export as Llama"):
        export_peft(random_adapters(gpt2, lora, 0), lora, gpt2, tmp_path / "a", "hf-llama")
    with pytest.raises(UserError, match="unknown export format 'peft'"):
        export_peft(random_adapters(gpt2, lora, 0), lora, gpt2, tmp_path / "a", "peft")
    with pytest.raises(UserError, match="the adapters .*missing"):
        export_peft({}, lora, gpt2, tmp_path / "a", "hf-gpt2")
    assert not (tmp_path / "a").exists()  # nothing written
