"""GGUF in: small llama and gpt2 files written here from random `transformers` models as llama.cpp's
converter writes them (tests/interop/gguf_convert.py), imported by sheepop and run in both
engines, against `transformers`' own GGUF loader on the same file (float32): the same logits.
Then every refusal (a field sheepop cannot compute, an unknown architecture or type, a bad file)
is one UserError line with nothing written, and the command line's exit statuses."""

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf_convert import gpt2_meta, gpt2_tensors, llama_meta, llama_tensors, write_gguf
from scrambled import scramble

from sheepop.checkpoint import format as checkpoint
from sheepop.cli import main
from sheepop.errors import UserError
from sheepop.inference.load import load
from sheepop.interop import llama
from sheepop.interop.gguf import import_gguf
from sheepop.tokenizers import train_tokenizer
from sheepop.tokenizers.gguf_vocab import gguf_vocab

transformers = pytest.importorskip("transformers")

TEXT = ("The quick brown fox jumps over the lazy dog. " * 3 + "def f(x):\n    return x + 1\n"
        "Pack my box with five dozen liquor jugs! 12345 67890 ") * 20
T = 32


@pytest.fixture(scope="module")
def bpe():
    return train_tokenizer("bpe", [TEXT], vocab_size=300)


def hf_llama(vocab: int, seed: int, **kw):
    settings = dict(vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=T,
                    rms_norm_eps=1e-5, rope_theta=500.0, tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**settings, **kw})).eval()
    scramble(model, seed)
    return model


def hf_gpt2(vocab: int, seed: int):
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=vocab, n_positions=1024, n_embd=32, n_layer=2, n_head=4)).eval()
    scramble(model, seed)
    return model


def reference_logits(path, ids: list[int]) -> np.ndarray:
    """transformers' GGUF loader on the file, float32: (len(ids), V)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


def sheepop_logits(run_dir, engine: str, ids: list[int]) -> np.ndarray:
    """(len(ids), V) through the engine's KV cache: the first token prefilled, then one decode
    step a token (so every position's rotation goes through the cache)."""
    lm = load(run_dir, engine=engine, device="cpu").lm
    return np.stack([lm.prefill(ids[:1])] + [lm.decode(t) for t in ids[1:]])


@pytest.fixture(scope="module")
def llama_file(tmp_path_factory, bpe):
    """An untied, grouped-query llama (4 heads, 2 key/value) with its tokenizer, float32."""
    model = hf_llama(bpe.vocab_size, seed=1)
    path = tmp_path_factory.mktemp("gguf") / "llama.gguf"
    write_gguf(path, "llama", {**llama_meta(model), **gguf_vocab(bpe)}, llama_tensors(model))
    return path, model


# ----- import: the same logits as transformers ------------------------------------------------

def test_llama_gguf_gives_transformers_logits_in_both_engines(tmp_path, bpe, llama_file):
    path, model = llama_file
    cfg, arch = import_gguf(path, tmp_path / "run")
    m = cfg.model
    assert arch.name == "Llama" and (m.n_head, m.kv_heads, m.n_embd, m.d_ff) == (4, 2, 32, 48)
    assert (m.rope_theta, m.block_size, m.tie_weights, m.ln_eps) == (500.0, T, False,
                                                                    pytest.approx(1e-5))
    ids = torch.randint(0, bpe.vocab_size, (T,), generator=torch.Generator().manual_seed(0))
    expected = reference_logits(path, ids.tolist())
    assert np.abs(expected).max() > 1.0  # logits big enough for the comparison to mean much
    with torch.no_grad():  # and transformers reads its own converter's file back exactly
        np.testing.assert_allclose(model(ids[None]).logits[0].numpy(), expected, atol=1e-5)
    for engine in ("torch", "numpy"):
        got = sheepop_logits(tmp_path / "run", engine, ids.tolist())
        np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0, err_msg=engine)
    saved = checkpoint.load_config(tmp_path / "run")
    assert saved["source"] == {"format": "gguf", "path": str(path.resolve()),
                               "architecture": "llama"}


def test_gguf_rows_are_sheepop_rows_and_hugging_face_rows_renumbered(tmp_path, llama_file):
    """Which permutation: none. llama.cpp's converter turns Hugging Face's rotate-half rows
    into the interleaved order sheepop rotates in, so the file's q and k rows are sheepop's
    as they are, and Hugging Face's are those renumbered (sheepop.interop.llama)."""
    path, model = llama_file
    import_gguf(path, tmp_path / "run")
    qkv = checkpoint.load_weights(tmp_path / "run")["blocks.0.attn.qkv.weight"]
    q_hf = model.model.layers[0].self_attn.q_proj.weight.detach().numpy()
    k_hf = model.model.layers[0].self_attn.k_proj.weight.detach().numpy()
    np.testing.assert_array_equal(qkv[:32], llama.from_rotate_half(q_hf, 4, 8))
    np.testing.assert_array_equal(qkv[32:48], llama.from_rotate_half(k_hf, 2, 8))
    assert not np.array_equal(qkv[:32], q_hf)


def test_a_tied_multi_head_llama_quantized_to_q8_0(tmp_path, bpe):
    """No output.weight: the head is the embedding. Q8_0 matrices: sheepop and transformers
    dequantize the same bytes, so they still agree within 1e-4."""
    model = hf_llama(bpe.vocab_size, seed=2, num_key_value_heads=4, tie_word_embeddings=True,
                     rope_theta=10000.0, intermediate_size=64)  # (Q8_0 rows: 32 weights a block)
    path = tmp_path / "tied.gguf"
    write_gguf(path, "llama", {**llama_meta(model), **gguf_vocab(bpe)}, llama_tensors(model),
               GGMLQuantizationType.Q8_0)
    cfg, _ = import_gguf(path, tmp_path / "run")
    assert cfg.model.tie_weights and cfg.model.n_kv_head == 0 and cfg.model.rope_theta == 1e4
    assert "head.weight" not in checkpoint.load_weights(tmp_path / "run")
    ids = (np.arange(T) * 7 % bpe.vocab_size).tolist()
    expected = reference_logits(path, ids)
    got = sheepop_logits(tmp_path / "run", "torch", ids)
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)


def test_gpt2_gguf_gives_transformers_logits_in_both_engines(tmp_path, bpe):
    """The fused attn_qkv as the converter writes it ((out, in), Q, K, V), biases, learned
    positions; output.weight a copy of the embedding, so the head is tied."""
    model = hf_gpt2(bpe.vocab_size, seed=3)
    path = tmp_path / "gpt2.gguf"
    write_gguf(path, "gpt2", {**gpt2_meta(model), **gguf_vocab(bpe)}, gpt2_tensors(model))
    cfg, arch = import_gguf(path, tmp_path / "run")
    m = cfg.model
    assert arch.name == "GPT-2" and m.tie_weights and m.block_size == 1024
    assert (m.pos_encoding, m.activation, m.norm, m.bias) == ("learned", "gelu_tanh",
                                                              "layernorm", True)
    ids = torch.randint(0, bpe.vocab_size, (T,), generator=torch.Generator().manual_seed(4))
    expected = reference_logits(path, ids.tolist())
    assert np.abs(expected).max() > 1.0
    for engine in ("torch", "numpy"):
        got = sheepop_logits(tmp_path / "run", engine, ids.tolist())
        np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0, err_msg=engine)


# ----- refusals: one line, nothing written ----------------------------------------------------

@pytest.mark.parametrize("meta, match", [
    ({"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 4.0},
     r"llama.rope.scaling.type = 'linear' is not supported \(sheepop's rope has no scaling\)"),
    ({"llama.rope.scaling.factor": 2.0}, "llama.rope.scaling.factor = 2.0 is not supported"),
    ({"llama.expert_count": 8, "llama.expert_used_count": 2},
     r"llama.expert_count = 8 is not supported \(mixture-of-experts"),
    ({"llama.rope.dimension_count": 4},
     r"llama.rope.dimension_count=4 is not supported \(sheepop's heads are embedding_length / "
     r"head_count = 8 wide"),
    ({"llama.attention.key_length": 16}, "llama.attention.key_length=16 is not supported"),
    ({"llama.attention.sliding_window": 8}, "llama.attention.sliding_window=8 is not supported"),
    ({"llama.final_logit_softcapping": 30.0}, "llama.final_logit_softcapping = 30.0 is not "
                                              "supported"),
    ({"llama.something_new": 1}, "llama.something_new = 1 is a field sheepop does not know"),
    ({"llama.vocab_size": 7}, "llama.vocab_size=7 but token_embd.weight has 300 rows"),
    ({"general.architecture": "mamba"},
     r"architecture 'mamba' is not supported \(sheepop imports 'llama', 'gpt2'\)"),
    ({"general.architecture": "qwen2"},
     "architecture 'qwen2' is not supported: its attention has biases on q, k and v only"),
])
def test_fields_sheepop_cannot_compute_are_refused_by_name(tmp_path, bpe, meta, match):
    model = hf_llama(bpe.vocab_size, seed=5)
    path = tmp_path / "m.gguf"
    arch = meta.pop("general.architecture", "llama")
    write_gguf(path, arch, {**llama_meta(model), **gguf_vocab(bpe), **meta},
               llama_tensors(model))
    with pytest.raises(UserError, match=match) as e:
        import_gguf(path, tmp_path / "run")
    assert "\n" not in str(e.value) and str(e.value).startswith(str(path))
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("change, match", [
    ("float64 norm", "tensor blk.1.ffn_norm.weight has type F64, which sheepop does not read"),
    ("missing", "the file lacks tensor blk.1.ffn_up.weight"),
    ("extra", "unexpected tensor rope_freqs.weight"),
    ("wide", r"tensor blk.0.ffn_gate.weight has shape \(48, 40\), the metadata says \(48, 32\)"),
    ("nan", "tensor blk.0.attn_v.weight holds 2 NaN or infinite values"),
])
def test_bad_tensors_are_refused_by_name(tmp_path, bpe, change, match):
    model = hf_llama(bpe.vocab_size, seed=6)
    tensors = llama_tensors(model)
    if change == "missing":
        del tensors["blk.1.ffn_up.weight"]
    elif change == "extra":
        tensors["rope_freqs.weight"] = np.ones(4, np.float32)
    elif change == "wide":
        tensors["blk.0.ffn_gate.weight"] = np.ones((48, 40), np.float32)
    elif change == "nan":
        tensors["blk.0.attn_v.weight"][0, :2] = [np.nan, np.inf]
    elif change == "float64 norm":
        tensors["blk.1.ffn_norm.weight"] = tensors["blk.1.ffn_norm.weight"].astype(np.float64)
    path = tmp_path / "m.gguf"
    write_gguf(path, "llama", {**llama_meta(model), **gguf_vocab(bpe)}, tensors)
    with pytest.raises(UserError, match=match):
        import_gguf(path, tmp_path / "run")
    assert not (tmp_path / "run").exists()


# ----- the command line -----------------------------------------------------------------------

def test_the_command_line_imports_a_gguf_file_by_its_bytes(tmp_path, capsys, llama_file):
    path, _ = llama_file
    named_otherwise = tmp_path / "model.bin"  # GGUF is told by its first bytes, not its name
    named_otherwise.write_bytes(path.read_bytes())
    assert main(["import", str(named_otherwise), str(tmp_path / "run")]) == 0
    assert capsys.readouterr().out == (
        f"imported Llama (2 layers, 4 heads (2 key/value), width 32, context {T}, vocabulary "
        f"300) into {tmp_path / 'run'}\n")
    assert main(["import", str(path), str(tmp_path / "run")]) == 2  # a run is there already
    assert "already holds a run" in capsys.readouterr().err


def test_the_command_line_refuses_bad_files_with_one_line(tmp_path, capsys, llama_file):
    path, _ = llama_file
    (tmp_path / "cut.gguf").write_bytes(path.read_bytes()[:-1000])
    (tmp_path / "notes.gguf").write_text("not a model\n")
    for name, message in [("cut.gguf", "not a readable GGUF file (truncated or corrupt"),
                          ("notes.gguf", "is not a GGUF file (it does not start with b'GGUF')"),
                          ("absent.gguf", "model not found")]:
        assert main(["import", str(tmp_path / name), str(tmp_path / "run")]) == 2
        err = capsys.readouterr().err
        assert err.startswith("sheepop: error: ") and message in err
        assert err.count("\n") == 1
    assert not (tmp_path / "run").exists()
