"""`sheepop train DATA --init-from RUN_DIR --out NEW` from the command line: a run trained
here and a Hugging Face Llama brought in by `sheepop import` keep training; every refusal is
one line and exit status 2, and leaves nothing behind."""

from __future__ import annotations

import json

import numpy as np
import pytest
from cli_refusal import fails
from variants import gqa, llama

from sheepop.checkpoint import format as checkpoint
from sheepop.cli import main

TEXT = ("The quick brown fox jumps over the lazy dog. " * 3 + "def f(x):\n    return x + 1\n"
        "Pack my box with five dozen liquor jugs! 12345 67890 ") * 20
SMALL = ["--no-progress", "--device", "cpu", "--threads", "1", "--set", "train.batch_size=4",
         "--set", "train.eval_batches=2", "--set", "train.log_interval=1"]


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "text.txt"
    path.write_text(TEXT)
    return path


@pytest.fixture(scope="module")
def source(tmp_path_factory, text):
    out = tmp_path_factory.mktemp("runs") / "source"
    code = main(["train", str(text), "--out", str(out), "--steps", "3", *SMALL,
                 "--set", "model.n_layer=1", "--set", "model.n_embd=16", "--set",
                 "model.n_head=2", "--set", "model.block_size=16"])
    assert code == 0
    return out


def rows(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_run_continues_from_another(capsys, source, text, tmp_path):
    capsys.readouterr()
    code = main(["train", str(text), "--init-from", str(source), "--out", str(tmp_path / "new"),
                 "--steps", "2", *SMALL, "--set", "model.dropout=0.1"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"init from {source} (step 3): its model, tokenizer and weights; a new optimizer, " \
           "from step 0" in out
    assert "step 0/2  val loss " in out and "before training" in out
    config = checkpoint.load_config(tmp_path / "new")
    assert config["init_from"] == {"path": str(source), "step": 3}
    assert config["model"] == {**checkpoint.load_config(source)["model"], "dropout": 0.1}
    assert [r["step"] for r in rows(tmp_path / "new")] == [0, 1, 2]


def test_refusals_are_one_line_and_leave_nothing(capsys, source, text, tmp_path):
    before = {p: p.read_bytes() for p in source.rglob("*") if p.is_file()}
    new = str(tmp_path / "new")
    train = ["train", str(text), "--steps", "1", "--no-progress"]
    fails(capsys, [*train, "--init-from", str(tmp_path / "nope"), "--out", new],
          "no such run directory")
    fails(capsys, [*train, "--init-from", str(tmp_path), "--out", new], "not a run directory")
    fails(capsys, [*train, "--init-from", str(source), "--out", str(source)],
          "are the same directory", "never written")
    fails(capsys, [*train, "--init-from", str(source), "--out", new, "--resume"],
          "--init-from starts a new run and --resume continues one")
    fails(capsys, [*train, "--init-from", str(source), "--out", new, "--set", "model.n_head=4"],
          "the run has 2 heads, the config asks for 4 (model.n_head)",
          "only model.dropout and model.block_size may be set")
    fails(capsys, [*train, "--init-from", str(source), "--out", new, "--tokenizer", "bpe"],
          "data.tokenizer is 'char', the config asks for 'bpe'")
    assert not (tmp_path / "new").exists()
    assert {p: p.read_bytes() for p in source.rglob("*") if p.is_file()} == before


# ----- a Hugging Face Llama, imported, keeps learning ------------------------------------------

@pytest.fixture(scope="module")
def imported_llama(tmp_path_factory, text):
    """A tiny random transformers LlamaForCausalLM (context 64, rotary positions), saved as
    safetensors with a byte-level BPE tokenizer.json, then `sheepop import`."""
    transformers = pytest.importorskip("transformers")
    import torch

    from sheepop.tokenizers import train_tokenizer
    from sheepop.tokenizers.hf import export_hf
    root = tmp_path_factory.mktemp("llama")
    bpe = train_tokenizer("bpe", [TEXT], vocab_size=300)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=bpe.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False))
    model.save_pretrained(root / "hf", safe_serialization=True)
    export_hf(bpe, root / "hf" / "tokenizer.json")
    assert main(["import", str(root / "hf"), str(root / "run")]) == 0
    return root / "run"


def test_an_imported_llama_keeps_learning(capsys, imported_llama, text, tmp_path):
    capsys.readouterr()
    code = main(["train", str(text), "--init-from", str(imported_llama), "--out",
                 str(tmp_path / "new"), "--steps", "40", *SMALL, "--set", "model.block_size=32",
                 "--set", "train.lr=3e-3", "--set", "train.warmup_steps=5",
                 "--set", "train.eval_interval=20"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"init from {imported_llama}: its model" in out  # no step: it never trained here
    metrics = rows(tmp_path / "new")
    vals = [(r["step"], r["val_loss"]) for r in metrics if "val_loss" in r]
    assert [s for s, _ in vals] == [0, 20, 40]
    # A random init starts near ln(V) (V = 300: 5.70); training on the text takes it far below.
    assert abs(vals[0][1] - np.log(300)) < 0.3, vals
    assert vals[2][1] < vals[1][1] < vals[0][1] - 1.0, vals
    saved = checkpoint.load_config(tmp_path / "new")
    assert saved["init_from"] == {"path": str(imported_llama), "step": None}
    expected = llama(**gqa(4, 2), block_size=32)  # the Llama's layer kinds, the new context
    assert {k: saved["model"][k] for k in expected} == expected
    assert main(["generate", str(tmp_path / "new"), "--prompt", "The quick", "--max-new-tokens",
                 "8", "--temperature", "0"]) == 0


def test_rotary_positions_may_run_past_the_source_context(capsys, imported_llama, text,
                                                          tmp_path):
    capsys.readouterr()
    code = main(["train", str(text), "--init-from", str(imported_llama), "--out",
                 str(tmp_path / "long"), "--steps", "1", *SMALL, "--set", "model.block_size=80"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert ("context 80, past the source's 64: rope positions are computed, but the source never "
            "trained on those; this run does") in out
    assert checkpoint.load_config(tmp_path / "long")["model"]["block_size"] == 80


def test_an_imported_llama_starts_at_its_own_loss_in_both_engines(capsys, imported_llama, text,
                                                                  tmp_path):
    """Grouped-query attention, rotary positions, RMSNorm and SwiGLU in each training engine:
    the step-0 evaluation equals the imported model's loss through sheepop.inference.load."""
    from sheepop.data.windows import eval_windows
    from sheepop.inference import load as inference
    starts = {}
    for engine in ("torch", "numpy"):
        out = tmp_path / engine
        assert main(["train", str(text), "--init-from", str(imported_llama), "--out", str(out),
                     "--steps", "2", "--engine", engine, *SMALL,
                     "--set", "model.block_size=32"]) == 0, capsys.readouterr().err
        starts[engine] = rows(out)[0]["val_loss"]
        assert rows(out)[-1]["val_loss"] < starts[engine]
    model = inference.load(imported_llama, engine="numpy", device="cpu")
    ids = np.asarray(model.tokenizer.encode(TEXT, add_eos=model.tokenizer.eos_id is not None))
    val = ids[len(ids) - int(len(ids) * 0.1):]
    x, y = eval_windows(val, 32, 8, model.tokenizer.pad_id or 0)
    total, count = model.loss_sum(x, y)
    assert starts["torch"] == pytest.approx(total / count, rel=1e-5)
    assert starts["numpy"] == pytest.approx(total / count, rel=1e-5)
