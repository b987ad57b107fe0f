"""Fixtures shared by the test folders (a test folder for most source packages;
docs/architecture.md, "Tests").

Every helper that more than one test file needs lives here, once: a small model configuration
(`small_cfg`) and its torch model (`small_lm`), torch on one thread (`one_torch_thread`, made
automatic by the folders that need it: model/, inference/, interop/), a tiny training run
(`tiny_text`, `tiny_config`, `tiny_trainer`, `read_metrics`) and an interrupted one
(`interrupt_after`).

Helper *modules* that test files import by name (`from tok_samples import PROSE`) live in
tests/helpers/, which this file puts on sys.path: pytest's default "prepend" import mode only adds
a test file's own folder, so a test in cli/ could not otherwise import what tokenizers/ shares.
Helpers used by one folder only stay in it (scratch/scratch_gradcheck.py,
data/ingest_fixtures.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from sheepop.config.build import build_config
from sheepop.config.schema import Config, ModelConfig
from sheepop.data.dataset import Dataset
from sheepop.model import GPT, TorchLM, compiler
from sheepop.tokenizers import train_tokenizer
from sheepop.train.start import setup

sys.path.insert(0, str(Path(__file__).with_name("helpers")))

from real_model import smollm2_gguf  # noqa: E402  (a helper module: on the path just above)

compiler.cache_by_capability()  # for the tests' own torch.compile calls too (model/compiler.py)

TINY_TEXT = "the quick brown fox jumps over the lazy dog. " * 60


# ----- a small model ---------------------------------------------------------------------------


@pytest.fixture
def small_cfg() -> ModelConfig:
    return ModelConfig(vocab_size=37, block_size=32, n_layer=2, n_head=4, n_embd=32, dropout=0.0)


@pytest.fixture
def small_lm(small_cfg) -> TorchLM:
    torch.manual_seed(0)
    return TorchLM(GPT(small_cfg))


@pytest.fixture
def one_torch_thread():
    # These models are tiny: a second thread only adds synchronisation, and on a machine shared
    # with other busy processes a spinning second thread made each step ~20x slower.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ----- a tiny training run (the torch and NumPy engines train the same one) --------------------


def _tiny_config(engine: str = "torch", dropout: float = 0.1, **train) -> Config:
    """2 layers of width 16 on 16-token windows, 12 steps, evaluated every 4; on the CPU in
    float32; `train` overrides train.* settings."""
    cfg = build_config(None, None, [
        "model.n_layer=2", "model.n_head=2", "model.n_embd=16", "model.block_size=16",
        f"model.dropout={dropout}", "train.batch_size=4", "train.steps=12",
        "train.warmup_steps=3", "train.eval_interval=4", "train.eval_batches=2",
        "train.log_interval=1", "train.checkpoint_interval=0", "train.lr=3e-3",
        f"train.engine={engine}", "train.device=cpu", "train.dtype=float32",
        "data.val_fraction=0.1"])
    for k, v in train.items():
        cfg.set(f"train.{k}", v)
    return cfg


def _tiny_dataset() -> Dataset:
    """TINY_TEXT in a char tokenizer: the first 2400 tokens train, the rest validate."""
    tok = train_tokenizer("char", [TINY_TEXT])
    ids = np.asarray(tok.encode(TINY_TEXT), dtype=np.uint16)
    return Dataset(ids[:2400], ids[2400:], tok)


def _tiny_trainer(cfg: Config, run_dir: Path, resume: bool = False):
    """The shared training loop on the tiny dataset, silent (no progress bar, no log)."""
    return setup(None, cfg, run_dir, resume=resume, dataset=_tiny_dataset(), progress=False,
                 log=lambda *_: None)


def _read_metrics(run_dir: Path) -> list[dict]:
    """The rows of a run's metrics.jsonl, one dict a logged step."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def tiny_text() -> str:
    return TINY_TEXT


@pytest.fixture
def tiny_config():
    return _tiny_config


@pytest.fixture
def tiny_trainer():
    return _tiny_trainer


@pytest.fixture
def read_metrics():
    return _read_metrics


def _interrupt_after(trainer, n_steps: int) -> None:
    """Make the trainer's engine raise KeyboardInterrupt (as Ctrl-C does) when step
    n_steps + 1 starts."""
    real_step, done = trainer.engine.train_step, []

    def step(micro, lr):
        if len(done) == n_steps:
            raise KeyboardInterrupt
        done.append(lr)
        return real_step(micro, lr)

    trainer.engine.train_step = step


@pytest.fixture
def interrupt_after():
    return _interrupt_after


# ----- the real model (tests marked real_model) -------------------------------------------------


@pytest.fixture(scope="session")
def smollm2_gguf_path() -> Path:
    """SmolLM2-135M-Instruct's GGUF file (tests/helpers/real_model.py); the test is skipped,
    with the reason, when the package cannot be had."""
    path, why = smollm2_gguf()
    if path is None:
        pytest.skip(why)
    return path


@pytest.fixture(scope="session")
def smollm2_run(smollm2_gguf_path, tmp_path_factory) -> Path:
    """SmolLM2 imported once per test session into a run directory (sheepop import)."""
    from sheepop.interop.gguf import import_gguf
    run = tmp_path_factory.mktemp("smollm2") / "run"
    import_gguf(smollm2_gguf_path, run)
    return run
