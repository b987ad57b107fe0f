"""GPT-2 both ways: a random transformers GPT-2 imported, a sheepop model exported, same logits."""

import json

import numpy as np
import pytest
import torch
from scrambled import scramble

from sheepop.checkpoint import format as checkpoint
from sheepop.config.schema import Config, ModelConfig
from sheepop.errors import UserError
from sheepop.interop import export_gpt2, import_gpt2
from sheepop.model import GPT
from sheepop.tokenizers import load as load_tokenizer
from sheepop.tokenizers import train_tokenizer

transformers = pytest.importorskip("transformers")

TEXT = ("The quick brown fox jumps over the lazy dog. " * 3 + "def f(x):\n    return x + 1\n"
        "Pack my box with five dozen liquor jugs! 12345 67890 ") * 20


@pytest.fixture(scope="module")
def bpe():
    return train_tokenizer("bpe", [TEXT], vocab_size=300)


def gpt2_cfg(vocab: int, **kw) -> ModelConfig:
    return ModelConfig(vocab_size=vocab, block_size=24, n_layer=2, n_head=4, n_embd=32,
                       pos_encoding="learned", activation="gelu_tanh", **kw)


def hf_model(vocab: int, seed: int, **kw):
    config = transformers.GPT2Config(vocab_size=vocab, n_positions=24, n_embd=32, n_layer=2,
                                     n_head=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                     **kw)
    model = transformers.GPT2LMHeadModel(config).eval()
    scramble(model, seed)
    return model


def sheepop_logits(run_dir, ids: torch.Tensor) -> np.ndarray:
    cfg = Config.from_dict({"model": checkpoint.load_config(run_dir)["model"]}).model
    model = GPT(cfg).eval()
    model.load_numpy_weights(checkpoint.load_weights(run_dir))
    with torch.no_grad():
        return model(ids)[0].numpy()


def test_import_matches_transformers_logits(tmp_path, bpe):
    hf = hf_model(bpe.vocab_size, seed=1, bos_token_id=bpe.eos_id, eos_token_id=bpe.eos_id)
    hf.save_pretrained(tmp_path / "hf")
    from sheepop.tokenizers.gpt2 import export_gpt2 as vocab_merges
    vocab_merges(bpe, tmp_path / "hf" / "vocab.json", tmp_path / "hf" / "merges.txt")
    import_gpt2(tmp_path / "hf", tmp_path / "run")
    ids = torch.randint(0, bpe.vocab_size, (3, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = hf(ids).logits.numpy()
    assert np.abs(expected).max() > 1.0  # logits big enough for the comparison to mean much
    np.testing.assert_allclose(sheepop_logits(tmp_path / "run", ids), expected, atol=1e-4,
                               rtol=0)
    tok = load_tokenizer(tmp_path / "run" / "tokenizer.json")
    assert tok.encode(TEXT[:200]) == bpe.encode(TEXT[:200])
    with pytest.raises(UserError, match="already holds a run"):
        import_gpt2(tmp_path / "hf", tmp_path / "run")


def test_import_of_a_relu2_gpt2_matches_transformers(tmp_path, bpe):
    """activation_function relu2 (transformers' max(x, 0)^2) is sheepop's model.activation
    relu2: the same logits."""
    hf = hf_model(bpe.vocab_size, seed=3, activation_function="relu2")
    hf.save_pretrained(tmp_path / "hf")
    from sheepop.tokenizers.gpt2 import export_gpt2 as vocab_merges
    vocab_merges(bpe, tmp_path / "hf" / "vocab.json", tmp_path / "hf" / "merges.txt")
    assert import_gpt2(tmp_path / "hf", tmp_path / "run").model.activation == "relu2"
    ids = torch.randint(0, bpe.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(ids).logits.numpy()
    np.testing.assert_allclose(sheepop_logits(tmp_path / "run", ids), expected, atol=1e-4,
                               rtol=0)


def test_import_keeps_an_untied_head(tmp_path, bpe):
    hf = hf_model(bpe.vocab_size, seed=2, tie_word_embeddings=False)
    assert not torch.equal(hf.lm_head.weight, hf.transformer.wte.weight)
    hf.save_pretrained(tmp_path / "hf")
    from sheepop.tokenizers.hf import export_hf
    export_hf(bpe, tmp_path / "hf" / "tokenizer.json")  # the tokenizer from tokenizer.json alone
    cfg = import_gpt2(tmp_path / "hf", tmp_path / "run")
    assert not cfg.model.tie_weights
    ids = torch.arange(20)[None] * 7 % bpe.vocab_size
    with torch.no_grad():
        expected = hf(ids).logits.numpy()
    np.testing.assert_allclose(sheepop_logits(tmp_path / "run", ids), expected, atol=1e-4,
                               rtol=0)


def test_export_loads_in_transformers_with_the_same_logits(tmp_path, bpe):
    cfg = gpt2_cfg(bpe.vocab_size, d_ff=48, ln_eps=1e-6)
    torch.manual_seed(3)
    model = GPT(cfg).eval()
    scramble(model, seed=3)
    config = Config()
    config.model = cfg
    checkpoint.save_checkpoint(tmp_path / "run", model.numpy_weights(), config.to_dict(),
                               bpe.to_json())
    assert export_gpt2(tmp_path / "run", tmp_path / "hf") == []
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    ids = torch.randint(0, bpe.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(ids)[0].numpy()
        np.testing.assert_allclose(hf(ids).logits.numpy(), expected, atol=1e-4, rtol=0)
    assert hf.config.n_inner == 48 and hf.config.layer_norm_epsilon == 1e-6
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    text = TEXT[:300] + " naïve ☃"
    assert hf_tok(text)["input_ids"] == bpe.encode(text)
    assert hf_tok.decode(bpe.encode(text)) == text
    # And back: the re-imported run has exactly the weights that were exported.
    import_gpt2(tmp_path / "hf", tmp_path / "back")
    again = checkpoint.load_weights(tmp_path / "back")
    for name, w in model.numpy_weights().items():
        assert np.array_equal(again[name], w), name


@pytest.mark.parametrize("setting, match", [
    ({"pos_encoding": "rope"}, "model.pos_encoding=rope"),
    ({"activation": "silu"}, "model.activation=silu"),
    ({"ffn": "swiglu"}, "model.ffn=swiglu"),
    ({"n_kv_head": 2}, "model.n_kv_head=2"),
    ({"tie_weights": False}, "model.tie_weights=false"),
    ({"head_bias": True}, "model.head_bias=true"),
    ({"bias": False}, "model.bias=false"),
    ({"norm": "rmsnorm"}, "model.norm=rmsnorm"),
])
def test_export_refuses_models_that_are_not_gpt2(tmp_path, bpe, setting, match):
    cfg = ModelConfig(**{**gpt2_cfg(bpe.vocab_size).__dict__, **setting})
    config = Config()
    config.model = cfg
    checkpoint.save_checkpoint(tmp_path / "run", GPT(cfg).numpy_weights(), config.to_dict(),
                               bpe.to_json())
    with pytest.raises(UserError, match=match):
        export_gpt2(tmp_path / "run", tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_import_refuses_pickles_and_other_models(tmp_path):
    d = tmp_path / "hf"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "gpt2", "vocab_size": 10,
                                               "n_positions": 8, "n_embd": 4, "n_layer": 1,
                                               "n_head": 1}))
    (d / "vocab.json").write_text("{}")
    (d / "pytorch_model.bin").write_bytes(b"\x80\x04not really")
    with pytest.raises(UserError, match="has only pickle weights"):
        import_gpt2(d, tmp_path / "run")
    (d / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(UserError, match="not 'gpt2'"):
        import_gpt2(d, tmp_path / "run")


def test_import_reads_original_gpt2_names_shards_and_half_precision(tmp_path, bpe):
    """OpenAI's GPT-2 files name weights without `transformer.` and carry causal-mask buffers;
    big models come in shards; many are stored in bfloat16."""
    from safetensors.torch import save_file
    hf = hf_model(bpe.vocab_size, seed=4)
    state = {k.removeprefix("transformer."): v.to(torch.bfloat16)
             for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    state["h.0.attn.bias"] = torch.tril(torch.ones(1, 1, 24, 24)).to(torch.bfloat16)
    d = tmp_path / "hf"
    d.mkdir()
    hf.config.to_json_file(d / "config.json")
    names = sorted(state)
    save_file({k: state[k].contiguous() for k in names[:9]}, d / "part1.safetensors")
    save_file({k: state[k].contiguous() for k in names[9:]}, d / "part2.safetensors")
    index = {"weight_map": {k: "part1.safetensors" if i < 9 else "part2.safetensors"
                            for i, k in enumerate(names)}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    from sheepop.tokenizers.gpt2 import export_gpt2 as vocab_merges
    vocab_merges(bpe, d / "vocab.json", d / "merges.txt")
    cfg = import_gpt2(d, tmp_path / "run")
    assert cfg.model.tie_weights
    with torch.no_grad():  # the reference: the same model with bfloat16-rounded weights
        for p in hf.parameters():
            p.copy_(p.to(torch.bfloat16).float())
        ids = torch.arange(24)[None] * 5 % bpe.vocab_size
        expected = hf(ids).logits.numpy()
    np.testing.assert_allclose(sheepop_logits(tmp_path / "run", ids), expected, atol=1e-4,
                               rtol=0)
