"""The export / import / generate commands end to end, on a small GPT-2-shaped run."""

import numpy as np
import pytest
import torch

from sheepop.checkpoint import format as checkpoint
from sheepop.cli import main
from sheepop.config.schema import Config, ModelConfig, SampleConfig
from sheepop.generation.generate import generate
from sheepop.generation.text_stream import stream_text
from sheepop.inference.load import build, load
from sheepop.model import GPT
from sheepop.tokenizers import IncrementalDecoder, train_tokenizer
from sheepop.tokenizers import load as load_tokenizer

TEXT = "the cat sat on the mat. the dog ate the hat. " * 30
pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: see tests/conftest.py


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    tok = train_tokenizer("bpe", [TEXT], vocab_size=280)
    cfg = Config()
    cfg.model = ModelConfig(vocab_size=tok.vocab_size, block_size=32, n_layer=2, n_head=2,
                            n_embd=16, pos_encoding="learned", activation="gelu_tanh")
    torch.manual_seed(0)
    model = GPT(cfg.model)
    path = tmp_path_factory.mktemp("runs") / "run"
    checkpoint.save_checkpoint(path, model.numpy_weights(), cfg.to_dict(), tok.to_json())
    return path


def test_export_then_import_gives_back_the_same_run(run_dir, tmp_path, capsys):
    assert main(["export", str(run_dir), "--to", "hf-gpt2", str(tmp_path / "hf")]) == 0
    assert {"config.json", "model.safetensors", "tokenizer.json", "vocab.json",
            "merges.txt"} <= {p.name for p in (tmp_path / "hf").iterdir()}
    assert main(["import", str(tmp_path / "hf"), str(tmp_path / "back")]) == 0
    assert "imported GPT-2 (2 layers" in capsys.readouterr().out
    a, b = checkpoint.load_weights(run_dir), checkpoint.load_weights(tmp_path / "back")
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert (checkpoint.load_tokenizer_json(tmp_path / "back")
            == checkpoint.load_tokenizer_json(run_dir))


def test_export_refusal_is_one_line_and_exit_2(run_dir, tmp_path, capsys):
    cfg = Config.from_dict({"model": checkpoint.load_config(run_dir)["model"]})
    cfg.model.activation = "silu"
    checkpoint.save_checkpoint(tmp_path / "silu", checkpoint.load_weights(run_dir),
                               cfg.to_dict(), checkpoint.load_tokenizer_json(run_dir))
    assert main(["export", str(tmp_path / "silu"), "--to", "hf-gpt2", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.strip() == ("sheepop: error: cannot export as GPT-2: model.activation=silu "
                           "(GPT-2's are gelu_tanh, gelu, relu, relu2)")


def test_generate_with_stop_and_penalty_prints_what_stream_text_gives(run_dir, capsys):
    args = ["generate", str(run_dir), "--prompt", "the cat", "--temperature", "0.9", "--seed",
            "1337", "--top-k", "0", "--top-p", "1", "--min-p", "0", "--max-new-tokens", "40",
            "--stop", "\\x20do", "--repetition-penalty", "1.2"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    tok = load_tokenizer(run_dir / "tokenizer.json")
    cfg = Config.from_dict({"model": checkpoint.load_config(run_dir)["model"]})
    lm = build(cfg, checkpoint.load_weights(run_dir), tok).lm
    sc = SampleConfig(max_new_tokens=40, temperature=0.9, repetition_penalty=1.2, seed=1337,
                      top_k=0, top_p=1.0, min_p=0.0)
    expected = "".join(stream_text(lm, tok.encode("the cat"), sc, IncrementalDecoder(tok),
                                   stop=[" do"], eos_id=tok.eos_id))
    assert printed == "the cat" + expected + "\n"
    uncut = "".join(stream_text(lm, tok.encode("the cat"), sc, IncrementalDecoder(tok),
                                eos_id=tok.eos_id))
    assert uncut.startswith(expected + " do") and " do" not in expected  # the stop did cut
    assert main(args[:-2] + ["--repetition-penalty", "0"]) == 2


def test_generate_in_bfloat16(run_dir, capsys):
    args = ["generate", str(run_dir), "--prompt", "the", "--temperature", "0",
            "--max-new-tokens", "5", "--dtype", "bfloat16"]
    for engine in ("torch", "numpy"):  # bf16 activations and cache; bf16 matrices only
        assert main(args + ["--engine", engine]) == 0
        out = capsys.readouterr()
        assert out.out.startswith("the") and f"{engine} engine, bfloat16" in out.err


def test_generate_slide_chunk_flag_sets_the_window_past_the_context(run_dir, capsys,
                                                                    monkeypatch):
    """Past the 32-token context of this learned-position model, --slide-chunk C reaches the
    loop as sample.slide_chunk = C and gives what the library gives with it."""
    import sheepop.generation.generate as loop
    chunks = []
    real = loop.slide_chunk
    monkeypatch.setattr(loop, "slide_chunk", lambda cfg, T: chunks.append(real(cfg, T))
                        or real(cfg, T))
    prompt, new = "the cat sat on the mat.", 60
    for chunk, expected in ((1, 1), (5, 5), (0, 8)):
        assert main(["generate", str(run_dir), "--prompt", prompt, "--max-new-tokens", str(new),
                     "--temperature", "0", "--slide-chunk", str(chunk)]) == 0
        text = capsys.readouterr().out
        assert chunks.pop() == expected  # 0: a quarter of block_size 32
        model = load(run_dir, "torch")
        cfg = SampleConfig(max_new_tokens=new, temperature=0.0, slide_chunk=chunk)
        tokens = [s.token for s in generate(model.lm, model.tokenizer.encode(prompt), cfg)]
        assert text == prompt + model.tokenizer.decode(tokens) + "\n"
    assert main(["generate", str(run_dir), "--prompt", "x", "--slide-chunk", "-1"]) == 2
    assert "slide_chunk must be >= 0" in capsys.readouterr().err
