"""A failed export leaves nothing it created (issue 41, section 5): the folders it made (OUT and
the missing ones above it) are removed, a folder that was there and empty is left empty, and a
folder that held something keeps exactly that. The failure is real: the export runs in a child
process whose files may not grow past 2 KiB (RLIMIT_FSIZE), so its first weights file fails
with EFBIG after OUT was made."""

from __future__ import annotations

import resource
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tiny_run import train_tiny_run
from variants import llama

from sheepop.checkpoint import format as checkpoint
from sheepop.config.schema import Config, ModelConfig
from sheepop.scratch.init import param_shapes
from sheepop.tokenizers import train_tokenizer


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """A GPT-2-shaped run (tiny_run's) and a Llama-shaped one with a bpe tokenizer."""
    root = tmp_path_factory.mktemp("export-cleanup")
    tok = train_tokenizer("bpe", ["the quick brown fox jumps over the lazy dog. " * 40],
                          vocab_size=300)
    cfg = Config()
    cfg.model = ModelConfig(vocab_size=tok.vocab_size, block_size=16, n_layer=1, n_head=2,
                            n_embd=32, d_ff=48, **llama(tie_weights=True))
    rng = np.random.default_rng(0)
    weights = {k: (rng.standard_normal(s) * 0.1).astype(np.float32)
               for k, s in param_shapes(cfg.model).items()}
    checkpoint.save_checkpoint(root / "llama", weights, cfg.to_dict(), tok.to_json())
    (root / "gpt2").mkdir()
    return {"gpt2": train_tiny_run(root / "gpt2", block_size=16), "llama": root / "llama"}


def _small_files() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # (a write past the limit: EFBIG, not a kill)
    resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048))


def export_failing(run: Path, out: Path, *args: str) -> str:
    """`sheepop export RUN OUT ARGS` with files capped at 2 KiB: its one error line."""
    done = subprocess.run([sys.executable, "-m", "sheepop", "export", str(run), str(out), *args],
                          capture_output=True, text=True, timeout=120, preexec_fn=_small_files)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    line = done.stderr.strip()
    assert len(line.splitlines()) == 1 and "cannot write the export" in line, line
    return line


KINDS = [("gpt2", ["--to", "hf-gpt2"]), ("llama", ["--to", "hf-llama"]),
         ("llama", ["--to", "gguf"])]


@pytest.mark.parametrize("run, args", KINDS, ids=[a[1] for _, a in KINDS])
def test_a_failed_export_removes_the_folders_it_made(runs, tmp_path, run, args):
    made = tmp_path / "new"
    out = made / "deeper" / ("model.gguf" if "gguf" in args else "out")
    export_failing(runs[run], out, *args)
    assert not made.exists() and sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("run, args", KINDS, ids=[a[1] for _, a in KINDS])
def test_a_failed_export_leaves_an_existing_folder_as_it_was(runs, tmp_path, run, args):
    empty, holding = tmp_path / "empty", tmp_path / "holding"
    empty.mkdir()
    holding.mkdir()
    (holding / "notes.txt").write_text("mine")
    gguf = "gguf" in args
    export_failing(runs[run], empty / "model.gguf" if gguf else empty, *args)
    assert empty.is_dir() and list(empty.iterdir()) == []
    if gguf:  # (a Hugging Face OUT that holds files is refused before anything is written)
        export_failing(runs[run], holding / "model.gguf", *args)
        assert [p.name for p in holding.iterdir()] == ["notes.txt"]
        assert (holding / "notes.txt").read_text() == "mine"
