"""Files that load but mislead (issue 28, the third round of hostile files), and the edges of the
disk. Each is stopped with one line (a UserError; exit status 2 through the command line).

- Weights that are each finite but overflow in the forward pass (3e38, pos_scale=1e308) used to
  generate id 0 forever (the argmax of NaN): `sheepop.generation.sample.check_finite`, the one
  place every sampler passes through, stops them. `eval` printed "loss nan ... nan bits/byte"
  with exit status 0 (and NaN in --json, which is not JSON): `InferenceModel.loss_sum` refuses
  the sum. The NumPy engine said it first in RuntimeWarnings on stderr (the server's too): its
  forward passes are now silent, the result that is not finite being what every caller tests.
"""

from __future__ import annotations

import errno
import json
import math
import os
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
from cli_refusal import fails
from tiny_run import TEXT, train_tiny_run
from variants import llama

from sheepop.checkpoint import format as checkpoint
from sheepop.cli import main
from sheepop.config.schema import Config, ModelConfig, SampleConfig
from sheepop.errors import UserError
from sheepop.generation.generate import generate_batch
from sheepop.generation.running_batch import RunningBatch
from sheepop.inference.load import load
from sheepop.scratch.init import param_shapes
from sheepop.tokenizers import train_tokenizer


def make_run(path: Path, scale: float = 0.1, **model) -> Path:
    """A run directory holding a random 1-layer model of width 16 (no training: quick)."""
    tok = train_tokenizer("bpe", [TEXT], vocab_size=300)
    config = Config()
    config.model = ModelConfig(vocab_size=tok.vocab_size, block_size=16, n_layer=1, n_head=2,
                               n_embd=16, **model)
    rng = np.random.default_rng(0)
    weights = {k: (rng.uniform(-1, 1, s) * scale).astype(np.float32)
               for k, s in param_shapes(config.model).items()}
    checkpoint.save_checkpoint(path, weights, config.to_dict(), tok.to_json())
    return path


# ----- finite weights that overflow -------------------------------------------------------------

OVERFLOWING = {"weights of 3e38": dict(scale=3e38),
               "pos_scale=1e308": dict(pos_encoding="sinusoidal", pos_scale=1e308)}


@pytest.mark.parametrize("engine", ["numpy", "torch"])
@pytest.mark.parametrize("case", list(OVERFLOWING))
def test_generate_stops_on_logits_that_are_not_finite(tmp_path, capsys, case, engine):
    run = make_run(tmp_path / "run", **OVERFLOWING[case])
    fails(capsys, ["generate", str(run), "--prompt", "the", "--max-new-tokens", "5",
                         "--engine", engine, "--temperature", "0"],
                "next-token logits hold")


def test_a_batch_stops_on_logits_that_are_not_finite(tmp_path):
    """The batched sampler (the server's) goes through the same check."""
    model = load(make_run(tmp_path / "run", scale=3e38), engine="numpy", device="cpu")
    with pytest.raises(UserError, match="NaN or infinite values"):
        list(generate_batch(model.lm, [[1, 2], [3]], SampleConfig(max_new_tokens=3)))


@pytest.mark.parametrize("engine", ["numpy", "torch"])
@pytest.mark.parametrize("case", list(OVERFLOWING))
def test_eval_stops_on_a_loss_that_is_not_finite(tmp_path, capsys, case, engine):
    run = make_run(tmp_path / "run", **OVERFLOWING[case])
    (tmp_path / "text.txt").write_text(TEXT)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a RuntimeWarning on the way fails the test
        fails(capsys, ["eval", str(run), "--data", str(tmp_path / "text.txt"), "--json",
                       "--engine", engine], "loss on this text is not finite",
              "cannot be evaluated")


def test_the_numpy_engine_reports_an_overflow_by_its_result_alone(tmp_path):
    """The server's running batch calls the engine with no generation loop around it (the loop
    silences NumPy while it samples): the logits it gets are not finite (answered with a 422),
    and nothing is written on stderr before that."""
    model = load(make_run(tmp_path / "run", scale=3e38), engine="numpy", device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        batch = RunningBatch(model.lm, 2)
        assert not np.isfinite(batch.join([[1, 2, 3], [4]])).any()
        assert not np.isfinite(batch.step([5, 6])).any()
        total, n = model.lm.loss_sum(np.array([[1, 2, 3]]), np.array([[2, 3, 4]]))
        assert n == 3 and not math.isfinite(total)


def test_a_sane_model_still_generates(tmp_path, capsys):
    """The same run with ordinary weights generates its 5 tokens (the check refuses only the
    overflow)."""
    run = make_run(tmp_path / "run")
    assert main(["generate", str(run), "--prompt", "the", "--max-new-tokens", "5",
                 "--temperature", "0"]) == 0
    assert capsys.readouterr().out.strip()


# ----- finetune --resume from another directory ---------------------------------------------------

def test_finetune_resumes_from_another_directory(tmp_path, monkeypatch, tiny_config,
                                                 tiny_trainer):
    """A fine-tuning run started with relative paths records its data absolutely (as `train`
    does), so `--resume` from elsewhere finds it (it once looked for chats.jsonl in the new
    working directory)."""
    from sheepop.finetune.run import RUN_FILE, finetune
    root = tmp_path / "work"
    cfg = tiny_config("torch", dropout=0.0)
    cfg.set("model.block_size", 32)
    tiny_trainer(cfg, root / "base").run()
    chats = [{"prompt": f"upper {w}", "completion": w.upper()} for w in ("fox", "dog", "lazy")]
    (root / "chats.jsonl").write_text("".join(json.dumps(c) + "\n" for c in chats * 4))
    settings = ["train.batch_size=2", "train.eval_batches=1", "train.device=cpu",
                "train.dtype=float32", "train.warmup_steps=0", "train.decay_steps=4"]
    monkeypatch.chdir(root)
    finetune("base", "chats.jsonl", "ft", overrides=settings, values={"train.steps": 2},
             log=lambda *_: None, progress=False)
    recorded = json.loads((root / "ft" / RUN_FILE).read_text())["data"]
    assert recorded == str(root / "chats.jsonl")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    summary = finetune(None, None, root / "ft", overrides=settings, values={"train.steps": 4},
                       resume=True, log=lambda *_: None, progress=False)
    assert summary.steps == 4 and not summary.interrupted


# ----- a full disk --------------------------------------------------------------------------------

@pytest.fixture
def disk_full(monkeypatch):
    """Every fsync fails as on a full disk (ENOSPC): each write that must reach the disk fails,
    as tests/train/test_checkpoint_crash.py's injected faults do."""
    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return lambda: monkeypatch.setattr(os, "fsync", full)


@pytest.mark.parametrize("command", ["tokenizer train", "export hf-llama", "export gguf",
                                     "prepare"])
def test_a_full_disk_is_one_line_naming_the_output(tmp_path, capsys, disk_full, command):
    (tmp_path / "corpus.txt").write_text(TEXT * 20)
    run = make_run(tmp_path / "run", **llama(tie_weights=True))
    out = tmp_path / "out"
    argv = {"tokenizer train": ["tokenizer", "train", "--kind", "bpe", "--vocab-size", "300",
                                "--out", str(out), str(tmp_path / "corpus.txt")],
            "export hf-llama": ["export", str(run), "--to", "hf-llama", str(out)],
            "export gguf": ["export", str(run), "--to", "gguf", str(out)],
            "prepare": ["prepare", str(tmp_path / "corpus.txt"), "--out", str(out),
                        "--workers", "1", "--no-progress"]}[command]
    disk_full()
    line = fails(capsys, argv, "cannot write the ")
    assert str(out) in line and "(the disk is full)" in line, line
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no stray temp


# ----- a saved run that asks too much or holds garbage --------------------------------------------

@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A real run (tiny_run.train_tiny_run), context 64: room for a chat."""
    return train_tiny_run(tmp_path_factory.mktemp("trained"), block_size=64)


def edit(run_dir: Path, name: str, change) -> None:
    data = json.loads((run_dir / name).read_text())
    change(data)
    (run_dir / name).write_text(json.dumps(data))


def pad_to_8_gib(run_dir: Path) -> None:
    with open(run_dir / checkpoint.MODEL_FILE, "r+b") as f:
        f.truncate(8 * 2**30)  # sparse: no disk used; refused from its header, never read


SAVED = [
    ("batch_size 10**12",
     lambda r: edit(r, checkpoint.CONFIG_FILE, lambda c: c["train"].update(batch_size=10**12)),
     "train.batch_size=1000000000000 is too large"),
    ("sampler a string",
     lambda r: edit(r, "trainer.json", lambda t: t.update(sampler="garbage")),
     "the sampler state is not one sheepop saved"),
    ("sampler rng a list",
     lambda r: edit(r, "trainer.json", lambda t: t["sampler"].update(rng=[1, 2])),
     "the sampler state is not one sheepop saved"),
    ("sampler rng state a string",
     lambda r: edit(r, "trainer.json", lambda t: t["sampler"]["rng"].update(state="x")),
     "the sampler state is not one sheepop saved"),
    ("sampler rng of another generator",
     lambda r: edit(r, "trainer.json",
                    lambda t: t["sampler"]["rng"].update(bit_generator="MT19937")),
     "the sampler state is not one sheepop saved"),
    ("model file padded to 8 GiB", pad_to_8_gib, "bytes after its last tensor"),
]


@pytest.mark.parametrize("spoil, prefix", [c[1:] for c in SAVED], ids=[c[0] for c in SAVED])
def test_resume_refuses_a_spoiled_run_with_one_line(trained, tmp_path, capsys, spoil, prefix):
    import resource
    run = Path(shutil.copytree(trained, tmp_path / "run"))
    spoil(run)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    fails(capsys, ["train", "--resume", "--out", str(run), "--steps", "3",
                         "--no-progress"], prefix)
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 512 * 1024, grown_kib  # bounded: nothing of the 8 GiB or 7 TiB read


def test_generate_refuses_a_padded_model_file_unread(trained, tmp_path, capsys):
    run = Path(shutil.copytree(trained, tmp_path / "run"))
    pad_to_8_gib(run)
    fails(capsys, ["generate", str(run), "--prompt", "the", "--max-new-tokens", "2"],
                "bytes after its last tensor")


def test_the_unspoiled_run_resumes(trained, tmp_path):
    """The same copy, unspoiled, resumes (so each refusal above is the spoiled field's)."""
    run = Path(shutil.copytree(trained, tmp_path / "run"))
    assert main(["train", "--resume", "--out", str(run), "--steps", "3", "--no-progress"]) == 0


# ----- a LoRA run whose adapters overflow ---------------------------------------------------------

@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, trained) -> Path:
    """LoRA adapters (rank 2 on qkv) fine-tuned 2 steps on the trained run."""
    from sheepop.finetune.run import finetune
    root = tmp_path_factory.mktemp("lora")
    chats = [{"prompt": f"upper {w}", "completion": w.upper()} for w in ("fox", "dog", "lazy")]
    (root / "chats.jsonl").write_text("".join(json.dumps(c) + "\n" for c in chats * 4))
    finetune(str(trained), str(root / "chats.jsonl"), root / "lora",
             overrides=["lora.rank=2", "lora.alpha=4", "lora.targets=qkv",
                        "train.batch_size=2", "train.eval_batches=1", "train.device=cpu",
                        "train.dtype=float32", "train.warmup_steps=0"],
             values={"train.steps": 2}, log=lambda *_: None, progress=False)
    return root / "lora"


def scaled_adapters(run_dir: Path, factor: float) -> None:
    weights = checkpoint.load_weights(run_dir)
    with np.errstate(over="ignore"):
        spoiled = {k: np.clip(v * np.float32(factor), -3e38, 3e38) for k, v in weights.items()}
    checkpoint.save_checkpoint(run_dir, spoiled, checkpoint.load_config(run_dir),
                               checkpoint.load_tokenizer_json(run_dir))


@pytest.mark.parametrize("case", ["alpha 1e300", "adapters of 1e30"])
def test_an_overflowing_lora_run_stops_with_one_line(lora_run, tmp_path, capsys, case):
    run = Path(shutil.copytree(lora_run, tmp_path / "lora"))
    if case == "alpha 1e300":
        edit(run, "lora.json", lambda d: d.update(alpha=1e300))
    else:
        scaled_adapters(run, 1e30)
    fails(capsys, ["generate", str(run), "--prompt", "the", "--max-new-tokens", "3",
                         "--temperature", "0"], "merging the LoRA adapters")


def test_a_full_disk_while_prepare_extracts_names_the_output_not_the_input(tmp_path, capsys,
                                                                              monkeypatch):
    """The documents' store fills up while a file is extracted: `prepare` stops with one line
    naming its output, where it used to skip every input as 'unreadable: No space left on
    device' and blame the input files."""
    from sheepop.data.ingest import store

    (tmp_path / "corpus.txt").write_text(TEXT * 20)
    out = tmp_path / "out"

    def full(self, raw):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(store.DocWriter, "write", full)
    line = fails(capsys, ["prepare", str(tmp_path / "corpus.txt"), "--out", str(out),
                                "--workers", "1", "--no-progress"], "cannot write the ")
    assert str(out) in line and "(the disk is full)" in line, line
    assert "corpus.txt" not in line
