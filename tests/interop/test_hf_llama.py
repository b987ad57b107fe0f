"""Llama both ways: the rotary pairs renumbered (sheepop's interleaved <-> transformers'
rotate-half), a random transformers LlamaForCausalLM imported and run in both engines, a sheepop
model exported and run by transformers: the same logits and the same greedy tokens."""

import json
import shutil

import numpy as np
import pytest
import torch
import variants
from scrambled import scramble

from sheepop.checkpoint import format as checkpoint
from sheepop.cli import export as export_cli
from sheepop.cli import main
from sheepop.config.schema import Config, ModelConfig, SampleConfig
from sheepop.errors import UserError
from sheepop.generation.generate import generate
from sheepop.inference.load import load, never_generated
from sheepop.interop import ARCHITECTURES, export_llama, import_hf, import_llama, llama
from sheepop.model import GPT
from sheepop.tokenizers import train_tokenizer

transformers = pytest.importorskip("transformers")

TEXT = ("The quick brown fox jumps over the lazy dog. " * 3 + "def f(x):\n    return x + 1\n"
        "Pack my box with five dozen liquor jugs! 12345 67890 ") * 20
T = 32  # the context of every model here


@pytest.fixture(scope="module")
def bpe():
    return train_tokenizer("bpe", [TEXT], vocab_size=300)


def llama_cfg(vocab: int, **kw) -> ModelConfig:
    settings = dict(vocab_size=vocab, block_size=T, n_layer=2, n_embd=32, d_ff=48,
                    rope_theta=500.0, ln_eps=1e-5,
                    **variants.llama(**variants.gqa(4, 2)))
    return ModelConfig(**{**settings, **kw})


def hf_llama(vocab: int, seed: int, **kw):
    settings = dict(vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=T,
                    rms_norm_eps=1e-5, rope_theta=500.0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**settings, **kw})).eval()
    scramble(model, seed)
    return model


def save_run(path, cfg: ModelConfig, weights, tok) -> None:
    config = Config()
    config.model = cfg
    checkpoint.save_checkpoint(path, weights, config.to_dict(), tok.to_json())


def logits_through_the_cache(run_dir, engine: str, ids: list[int]) -> np.ndarray:
    """(len(ids), V): the first token prefilled, then one decode step per token (so every
    position's rotation goes through the engine's KV cache)."""
    lm = load(run_dir, engine=engine, device="cpu").lm
    rows = [lm.prefill(ids[:1])] + [lm.decode(t) for t in ids[1:]]
    np.testing.assert_allclose(lm.full(ids), rows[-1], atol=1e-5, rtol=0)
    return np.stack(rows)


# ----- the rotary pairs and the mappings, on their own ----------------------------------------

def test_renumbering_turns_sheepop_rope_into_transformers_rope():
    """Rotating with sheepop's interleaved rule, then renumbering, equals renumbering, then
    rotating with transformers' own rotate-half code."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    from sheepop.scratch.rope import rope_angles, rope_forward
    assert llama.rotate_half_order(8).tolist() == [0, 2, 4, 6, 1, 3, 5, 7]
    H, dk, n, theta = 4, 8, 12, 500.0
    rng = np.random.default_rng(0)
    q, k = (rng.standard_normal((1, H, n, dk)).astype(np.float32) for _ in range(2))
    angles = rope_angles(slice(0, n), dk, theta, np.float32)
    ours_q, ours_k = rope_forward(q, angles), rope_forward(k, angles)
    rotary = LlamaRotaryEmbedding(transformers.LlamaConfig(
        hidden_size=H * dk, num_attention_heads=H, rope_theta=theta, max_position_embeddings=n))
    cos, sin = rotary(torch.from_numpy(q), torch.arange(n)[None])
    perm = llama.rotate_half_order(dk)
    hf_q, hf_k = apply_rotary_pos_emb(torch.from_numpy(q[..., perm]),
                                      torch.from_numpy(k[..., perm]), cos, sin)
    np.testing.assert_allclose(hf_q.numpy(), ours_q[..., perm], atol=1e-5, rtol=0)
    np.testing.assert_allclose(hf_k.numpy(), ours_k[..., perm], atol=1e-5, rtol=0)
    assert not np.allclose(hf_q.numpy(), ours_q, atol=0.1)  # (unrenumbered they differ)
    # On weights: the rows of each head, in HF order, and back.
    w = np.arange(2 * dk * 3, dtype=np.float32).reshape(2 * dk, 3)
    hf_w = llama.to_rotate_half(w, 2, dk)
    assert hf_w[:, 0].tolist() == [0, 6, 12, 18, 3, 9, 15, 21, 24, 30, 36, 42, 27, 33, 39, 45]
    assert np.array_equal(llama.from_rotate_half(hf_w, 2, dk), w)


def test_weights_round_trip_exactly_and_the_config_both_ways():
    hf = hf_llama(300, seed=5)
    state = {k: v.numpy() for k, v in hf.state_dict().items()}
    cfg = llama.model_config_from_hf(hf.config.to_dict(), "config.json")
    assert cfg == llama_cfg(300)  # every setting read: kv heads, theta, eps, d_ff, untied head
    _, ours = llama.from_hf_weights(state, cfg, "hf")
    assert ours["blocks.0.attn.qkv.weight"].shape == ((4 + 2 * 2) * 8, 32)
    back = llama.to_hf_weights(ours, cfg)
    assert back.keys() == state.keys()
    assert all(np.array_equal(back[k], state[k]) for k in state)
    # sheepop's config -> config.json -> sheepop's config, and transformers reads config.json.
    exported = llama.hf_config(cfg, bos_id=1, eos_id=2)
    assert llama.model_config_from_hf(exported, "x") == cfg
    # A transformers 4 config.json names the base rope_theta, beside rope_scaling null.
    older = {k: v for k, v in exported.items() if k != "rope_parameters"}
    assert llama.model_config_from_hf(older, "x") == cfg
    assert llama.model_config_from_hf({**older, "rope_theta": 1e6}, "x").rope_theta == 1e6
    read = transformers.LlamaConfig.from_dict(exported)
    assert (read.num_key_value_heads, read.head_dim, read.intermediate_size) == (2, 8, 48)
    assert (read.tie_word_embeddings, read.rms_norm_eps, read.max_position_embeddings) == \
        (False, 1e-5, T)
    theta = getattr(read, "rope_parameters", None) or {"rope_theta": read.rope_theta}
    assert theta["rope_theta"] == 500.0


# ----- import ---------------------------------------------------------------------------------

def test_import_matches_transformers_logits_in_both_engines(tmp_path, bpe):
    hf = hf_llama(bpe.vocab_size, seed=1)
    hf.save_pretrained(tmp_path / "hf")
    from sheepop.tokenizers.hf import export_hf
    export_hf(bpe, tmp_path / "hf" / "tokenizer.json")
    cfg, arch = import_hf(tmp_path / "hf", tmp_path / "run")  # the architecture from model_type
    assert arch.name == "Llama" and cfg.model.kv_heads == 2 and not cfg.model.tie_weights
    ids = torch.randint(0, bpe.vocab_size, (T,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = hf(ids[None]).logits[0].numpy()
    assert np.abs(expected).max() > 1.0  # logits big enough for the comparison to mean much
    for engine in ("torch", "numpy"):
        got = logits_through_the_cache(tmp_path / "run", engine, ids.tolist())
        np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0, err_msg=engine)
    assert checkpoint.load_config(tmp_path / "run")["source"]["format"] == "hf-llama"


def test_import_of_a_tied_multi_head_llama(tmp_path, bpe):
    hf = hf_llama(bpe.vocab_size, seed=2, num_key_value_heads=4, tie_word_embeddings=True,
                  rope_theta=10000.0)
    hf.save_pretrained(tmp_path / "hf")
    from sheepop.tokenizers.gpt2 import export_gpt2 as vocab_merges
    vocab_merges(bpe, tmp_path / "hf" / "vocab.json", tmp_path / "hf" / "merges.txt")
    cfg = import_llama(tmp_path / "hf", tmp_path / "run")
    assert cfg.model.tie_weights and cfg.model.n_kv_head == 0 and cfg.model.rope_theta == 1e4
    assert "head.weight" not in checkpoint.load_weights(tmp_path / "run")
    ids = (torch.arange(T) * 7 % bpe.vocab_size).tolist()
    with torch.no_grad():
        expected = hf(torch.tensor([ids])).logits[0].numpy()
    got = logits_through_the_cache(tmp_path / "run", "torch", ids)
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)


@pytest.fixture(scope="module")
def saved_hf(tmp_path_factory, bpe):
    d = tmp_path_factory.mktemp("hf") / "llama"
    hf_llama(bpe.vocab_size, seed=3).save_pretrained(d)
    from sheepop.tokenizers.hf import export_hf
    export_hf(bpe, d / "tokenizer.json")
    return d


@pytest.mark.parametrize("change, match", [
    ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}, "rope_parameters": None},
     "rope_scaling is set"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}},
     "rope_parameters.rope_type='llama3' is not supported"),
    ({"attention_bias": True}, "attention_bias=true is not supported"),
    ({"mlp_bias": True}, "mlp_bias=true is not supported"),
    ({"head_dim": 16}, r"head_dim=16 is not supported \(sheepop's heads are hidden_size / "
                       r"num_attention_heads = 8 wide\)"),
    ({"hidden_act": "gelu"}, "hidden_act='gelu' is not supported"),
    ({"num_key_value_heads": 3}, "num_attention_heads=4 is not a multiple of "
                                 "num_key_value_heads=3"),
    ({"max_position_embeddings": 0}, "model.block_size must be at least 1"),
    ({"model_type": "mistral"}, "model_type is 'mistral'; sheepop imports 'gpt2', 'llama'"),
])
def test_import_refuses_what_sheepop_cannot_compute(tmp_path, saved_hf, change, match):
    d = tmp_path / "hf"
    shutil.copytree(saved_hf, d)
    hf = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**hf, **change}))
    with pytest.raises(UserError, match=match):
        import_hf(d, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_import_refuses_pickle_weights_and_mismatched_shapes(tmp_path, saved_hf):
    d = tmp_path / "hf"
    shutil.copytree(saved_hf, d)
    (d / "model.safetensors").rename(d / "pytorch_model.bin")
    with pytest.raises(UserError, match="has only pickle weights"):
        import_llama(d, tmp_path / "run")
    shutil.copy(saved_hf / "model.safetensors", d / "model.safetensors")
    hf = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**hf, "intermediate_size": 64}))
    with pytest.raises(UserError, match=r"layers.0.mlp.gate_proj.weight has shape \(48, 32\), "
                                        r"the config says \(64, 32\)"):
        import_llama(d, tmp_path / "run")
    assert not (tmp_path / "run").exists()


# ----- export ---------------------------------------------------------------------------------

def test_export_runs_in_transformers_with_the_same_logits_and_greedy_text(tmp_path, bpe):
    cfg = llama_cfg(bpe.vocab_size)
    model = GPT(cfg).eval()
    scramble(model, seed=5)  # (a seed whose greedy text does not settle on one token)
    save_run(tmp_path / "run", cfg, model.numpy_weights(), bpe)
    assert export_llama(tmp_path / "run", tmp_path / "hf") == []
    hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert (hf.config.num_key_value_heads, hf.config.tie_word_embeddings) == (2, False)
    ids = torch.randint(0, bpe.vocab_size, (2, T), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        np.testing.assert_allclose(hf(ids).logits.numpy(), model(ids)[0].numpy(), atol=1e-4,
                                   rtol=0)
    # 20 greedy tokens: sheepop's generation loop against transformers' generate, each with
    # the same never-drawn ids (padding, BOS) and the same end token.
    prompt = bpe.encode("The quick brown")
    ours = load(tmp_path / "run", device="cpu")
    tokens = [s.token for s in generate(ours.lm, prompt, SampleConfig(max_new_tokens=20,
                                                                      temperature=0.0),
                                        eos_id=bpe.eos_id)]
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert hf_tok("The quick brown")["input_ids"] == prompt
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]),
                          max_new_tokens=20, do_sample=False,
                          suppress_tokens=never_generated(bpe), pad_token_id=bpe.pad_id)
    assert len(tokens) == 20 and len(set(tokens)) > 10  # a text, not one token repeated
    assert out[0, len(prompt):].tolist() == tokens
    text = hf_tok.decode(out[0])
    assert text == bpe.decode(prompt + tokens) and text.startswith("The quick brown")
    # And back: the re-imported run has exactly the weights that were exported.
    import_llama(tmp_path / "hf", tmp_path / "back")
    again = checkpoint.load_weights(tmp_path / "back")
    assert again.keys() == model.numpy_weights().keys()
    for name, w in model.numpy_weights().items():
        assert np.array_equal(again[name], w), name


def test_export_of_a_tied_head_and_the_command_line(tmp_path, bpe, capsys):
    cfg = llama_cfg(bpe.vocab_size, tie_weights=True, n_kv_head=1, rope_theta=10000.0)
    model = GPT(cfg).eval()
    scramble(model, seed=6)
    save_run(tmp_path / "run", cfg, model.numpy_weights(), bpe)
    assert main(["export", str(tmp_path / "run"), "--to", "hf-llama", str(tmp_path / "hf")]) == 0
    assert capsys.readouterr().out == f"wrote a Hugging Face Llama model to {tmp_path / 'hf'}\n"
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    ids = (torch.arange(T) * 11 % bpe.vocab_size)[None]
    with torch.no_grad():
        np.testing.assert_allclose(hf(ids).logits.numpy(), model(ids)[0].numpy(), atol=1e-4,
                                   rtol=0)
    assert main(["import", str(tmp_path / "hf"), str(tmp_path / "back")]) == 0
    assert capsys.readouterr().out == (
        f"imported Llama (2 layers, 4 heads (1 key/value), width 32, context {T}, vocabulary "
        f"{bpe.vocab_size}) into {tmp_path / 'back'}\n")
    assert export_cli.FORMATS == (*ARCHITECTURES, "gguf")  # Hugging Face's, then GGUF


@pytest.mark.parametrize("setting, match", [
    ({"pos_encoding": "learned"}, "model.pos_encoding=learned"),
    ({"norm": "layernorm"}, "model.norm=layernorm"),
    ({"ffn": "mlp"}, "model.ffn=mlp"),
    ({"bias": True}, "model.bias=true"),
    ({"head_bias": True}, "model.head_bias=true"),
])
def test_export_refuses_models_that_are_not_llama(tmp_path, bpe, setting, match, capsys):
    cfg = llama_cfg(bpe.vocab_size, **setting)
    save_run(tmp_path / "run", cfg, GPT(cfg).numpy_weights(), bpe)
    assert main(["export", str(tmp_path / "run"), "--to", "hf-llama", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.startswith(f"sheepop: error: cannot export as Llama: {match} (")
    assert not (tmp_path / "o").exists()
