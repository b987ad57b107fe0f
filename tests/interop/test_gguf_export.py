"""GGUF out: a Llama-shaped sheepop model exported as GGUF and read back by `transformers`' GGUF
loader (an independent reader) to the model's own logits: within 1e-4 in f32; f16, bf16 and q8_0
within the tolerances measured for them (below). The metadata has the types llama.cpp reads, the
file is written atomically, and what cannot be exported is refused before anything is written."""

import dataclasses

import numpy as np
import pytest
import torch
from gguf import GGUFReader, GGUFValueType
from variants import gqa, llama

from sheepop.checkpoint import format as checkpoint
from sheepop.cli import export as export_cli
from sheepop.cli import main
from sheepop.config.schema import Config, ModelConfig
from sheepop.errors import UserError
from sheepop.inference.load import load
from sheepop.interop import gguf_export
from sheepop.interop.gguf import import_gguf
from sheepop.interop.gguf_export import export_gguf
from sheepop.model import GPT
from sheepop.tokenizers import train_tokenizer
from sheepop.tokenizers.pretokenize import PATTERNS

transformers = pytest.importorskip("transformers")

TEXT = ("The quick brown fox jumps over the lazy dog. " * 3 + "def f(x):\n    return x + 1\n"
        "Pack my box with five dozen liquor jugs! 12345 67890 ") * 20
T = 32
# The largest logit difference from the float32 model measured on the untied model below (seed 5,
# two sequences of 32 random tokens, logits up to ~LOGITS), and the bound asserted, about twice
# that: f32 1.0e-6 -> 1e-4;  f16 2.3e-3 -> 5e-3;  bf16 1.7e-2 -> 4e-2;  q8_0 7.2e-2 -> 0.15
# (q8_0's tied model with f16 fallbacks: 4.1e-2). Rounding every weight of random matrices whose
# rows sum 32-64 products: a relative error of ~2^-11 (f16), 2^-8 (bf16), 1/254 of a block's
# largest weight (q8_0) on each.
TOLERANCE = {"f32": 1e-4, "f16": 5e-3, "bf16": 4e-2, "q8_0": 0.15}


@pytest.fixture(scope="module")
def bpe():
    return train_tokenizer("bpe", [TEXT], vocab_size=300)


def llama_cfg(vocab: int, **kw) -> ModelConfig:
    settings = dict(vocab_size=vocab, block_size=T, n_layer=2, n_embd=32, d_ff=64,
                    rope_theta=500.0, ln_eps=1e-5, **llama(**gqa(4, 2)))
    return ModelConfig(**{**settings, **kw})


def scrambled_run(path, cfg: ModelConfig, tok, seed: int) -> GPT:
    """A run directory holding a GPT of `cfg` with every parameter random and O(0.1-1)."""
    model = GPT(cfg).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.5 if p.dim() == 1 else 0.2))
    config = Config()
    config.model = cfg
    checkpoint.save_checkpoint(path, model.numpy_weights(), config.to_dict(), tok.to_json())
    return model


def transformers_logits(path, ids: torch.Tensor) -> np.ndarray:
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    with torch.no_grad():
        return hf(ids).logits.numpy()


@pytest.fixture(scope="module")
def untied_run(tmp_path_factory, bpe):
    d = tmp_path_factory.mktemp("export")
    model = scrambled_run(d / "run", llama_cfg(bpe.vocab_size), bpe, seed=5)
    return d / "run", model


@pytest.mark.parametrize("gguf_type", ["f32", "f16", "bf16", "q8_0"])
def test_transformers_reads_the_export_back_to_the_same_logits(tmp_path, bpe, untied_run,
                                                               gguf_type):
    run, model = untied_run
    assert export_gguf(run, tmp_path / "m.gguf", gguf_type) == []
    ids = torch.randint(0, bpe.vocab_size, (2, T), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = model(ids)[0].numpy()
    assert np.abs(ours).max() > 1.0
    got = transformers_logits(tmp_path / "m.gguf", ids)
    gap = float(np.abs(got - ours).max())
    print(f"{gguf_type}: largest logit difference {gap:.2e} (logits up to "
          f"{np.abs(ours).max():.1f})")
    assert gap <= TOLERANCE[gguf_type]
    if gguf_type != "f32":
        assert gap > 1e-6  # (the weights were rounded: a lower precision was written)
        # The whole gap is the rounding: the file imported back into sheepop gives
        # transformers' logits on that same file.
        import_gguf(tmp_path / "m.gguf", tmp_path / "back")
        lm = load(tmp_path / "back", engine="torch", device="cpu").lm
        np.testing.assert_allclose(np.stack([lm.full(row) for row in ids.tolist()]), got[:, -1],
                                   atol=1e-4, rtol=0)


def test_an_f32_export_imports_back_to_the_same_weights_and_metadata_types(tmp_path, untied_run):
    run, model = untied_run
    export_gguf(run, tmp_path / "m.gguf")
    cfg, _ = import_gguf(tmp_path / "m.gguf", tmp_path / "back")
    # GGUF stores the epsilon as a float32 (llama.cpp reads it so): 1e-5 comes back rounded.
    assert cfg.model.ln_eps == np.float32(1e-5) and cfg.model.ln_eps != 1e-5
    assert dataclasses.replace(cfg.model, ln_eps=1e-5) == llama_cfg(300)
    back = checkpoint.load_weights(tmp_path / "back")
    assert back.keys() == model.numpy_weights().keys()
    for name, w in model.numpy_weights().items():
        assert np.array_equal(back[name], w), name
    # The types llama.cpp's loader insists on (it refuses a key of another type).
    fields = GGUFReader(tmp_path / "m.gguf").fields
    assert fields["general.architecture"].contents() == "llama"
    u32 = [GGUFValueType.UINT32]
    for key in ("block_count", "context_length", "embedding_length", "feed_forward_length",
                "attention.head_count", "attention.head_count_kv", "rope.dimension_count"):
        assert fields[f"llama.{key}"].types == u32, key
    for key in ("attention.layer_norm_rms_epsilon", "rope.freq_base"):
        assert fields[f"llama.{key}"].types == [GGUFValueType.FLOAT32], key
    assert fields["general.file_type"].contents() == 0  # ALL_F32
    assert fields["tokenizer.ggml.tokens"].types == [GGUFValueType.ARRAY, GGUFValueType.STRING]


def test_a_tied_head_writes_no_output_tensor_and_q8_0_falls_back_where_rows_do_not_fit(
        tmp_path, bpe):
    cfg = llama_cfg(bpe.vocab_size, tie_weights=True, n_kv_head=1, d_ff=48)
    model = scrambled_run(tmp_path / "run", cfg, bpe, seed=6)
    notes = export_gguf(tmp_path / "run", tmp_path / "m.gguf", "q8_0")
    assert notes == ["2 matrices have rows whose length is not a multiple of 32 and were "
                     "written as f16, not q8_0 (first: blk.0.ffn_down.weight)"]
    reader = GGUFReader(tmp_path / "m.gguf")
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert "output.weight" not in types
    assert (types["blk.0.ffn_down.weight"], types["blk.0.ffn_up.weight"],
            types["blk.0.attn_norm.weight"]) == ("F16", "Q8_0", "F32")
    ids = (torch.arange(T) * 11 % bpe.vocab_size)[None]
    with torch.no_grad():
        ours = model(ids)[0].numpy()
    assert np.abs(transformers_logits(tmp_path / "m.gguf", ids) - ours).max() <= \
        TOLERANCE["q8_0"]


def test_the_command_line_and_what_it_refuses(tmp_path, bpe, untied_run, capsys):
    run, _ = untied_run
    out = tmp_path / "out" / "m.gguf"
    assert main(["export", str(run), str(out), "--to", "gguf", "--gguf-type", "f16"]) == 0
    assert capsys.readouterr().out == f"wrote a GGUF Llama model (f16) to {out}\n"
    assert sorted(p.name for p in out.parent.iterdir()) == ["m.gguf"]  # no temporary left
    assert export_cli.FORMATS[-1] == "gguf" and export_cli.GGUF_TYPES == gguf_export.GGUF_TYPES
    # Refused, each in one line, with nothing written: not Llama-shaped, a char tokenizer, a
    # directory as the output, --adapters.
    gpt = llama_cfg(bpe.vocab_size, pos_encoding="learned")
    scrambled_run(tmp_path / "gpt", gpt, bpe, seed=1)
    chars = train_tokenizer("char", [TEXT])
    scrambled_run(tmp_path / "chars", llama_cfg(chars.vocab_size), chars, seed=1)
    (tmp_path / "adir").mkdir()
    for args, message in [
        ([str(tmp_path / "gpt"), str(tmp_path / "x.gguf")], "cannot export as Llama: "
                                                            "model.pos_encoding=learned"),
        ([str(tmp_path / "chars"), str(tmp_path / "x.gguf")], "char"),
        ([str(run), str(tmp_path / "adir")], "is a directory; give the GGUF file to write"),
        ([str(run), str(tmp_path / "x.gguf"), "--adapters"], "leave --adapters out"),
    ]:
        assert main(["export", *args, "--to", "gguf"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("sheepop: error: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "x.gguf").exists() and list((tmp_path / "adir").iterdir()) == []


def test_the_file_names_the_split_as_llama_cpp_knows_it_or_is_refused(tmp_path, bpe,
                                                                      untied_run, capsys):
    """llama.cpp refuses a whole file whose tokenizer.ggml.pre it does not know ("gpt2" was
    written): the default bpe (no token across a combining mark) is written as "gpt-2"; a bpe
    that learned "e" + U+0301 as one token has no llama.cpp name and is refused in one line."""
    run, _ = untied_run
    assert bpe.pattern == PATTERNS["gpt2"]  # sheepop's default split
    export_gguf(run, tmp_path / "m.gguf")
    assert GGUFReader(tmp_path / "m.gguf").fields["tokenizer.ggml.pre"].contents() == "gpt-2"
    marked = train_tokenizer("bpe", ["e\u0301crit " * 400 + TEXT], vocab_size=300)
    scrambled_run(tmp_path / "marked", llama_cfg(marked.vocab_size), marked, seed=2)
    out = tmp_path / "marked.gguf"
    assert main(["export", str(tmp_path / "marked"), str(out), "--to", "gguf"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sheepop: error: this bpe tokenizer's token ") and \
        "joins a combining mark to another character" in err and err.count("\n") == 1
    assert not out.exists()


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, untied_run,
                                                                   monkeypatch):
    run, _ = untied_run
    out = tmp_path / "m.gguf"
    out.write_bytes(b"the old file")
    import gguf

    def fail(self, **kw):
        raise OSError("disk full")

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", fail)
    with pytest.raises(OSError, match="disk full"):
        export_gguf(run, out)
    assert out.read_bytes() == b"the old file"
    assert [p.name for p in tmp_path.iterdir()] == ["m.gguf"]


def test_unknown_types_are_refused(tmp_path, untied_run):
    with pytest.raises(UserError, match=r"unknown GGUF type 'q4_0' \(known: f32, f16, bf16, "
                                        r"q8_0\)"):
        export_gguf(untied_run[0], tmp_path / "m.gguf", "q4_0")
