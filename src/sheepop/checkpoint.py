"""The checkpoint format shared by both engines (see docs/architecture.md, "Checkpoints").

Weights are plain NumPy float32 arrays keyed by the parameter names both engines use; files are
safetensors and JSON, so loading a user's checkpoint never runs code (no pickle). Every file is
written atomically (`sheepop.files`: a temporary name, then a rename); `trainer.json`, written
last, records the SHA-256 of the weight files so a checkpoint torn by a crash is detected.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from sheepop.errors import UserError
from sheepop.files import (
    DocumentFormat,
    atomic_write_bytes,
    atomic_write_text,
    decode_text,
    parse_json,
    read_bytes,
    read_document,
    write_document,
)

FORMAT = "sheepop-run"
VERSION = 1
RUN_CONFIG = DocumentFormat(FORMAT, VERSION, "sheepop run config")
MODEL_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.json"
TRAINER_FILE = "trainer.safetensors"
TRAINER_JSON = "trainer.json"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def save_checkpoint(run_dir: str | Path, weights: dict[str, np.ndarray], config: dict[str, Any],
                    tokenizer_json: str, trainer_arrays: dict[str, np.ndarray] | None = None,
                    trainer_state: dict[str, Any] | None = None) -> None:
    """Write a checkpoint into `run_dir` (weights always; trainer state when given)."""
    run_dir = Path(run_dir)
    model_bytes = st_save({k: np.ascontiguousarray(v, dtype=np.float32)
                           for k, v in weights.items()}, metadata={"format": FORMAT})
    atomic_write_bytes(run_dir / MODEL_FILE, model_bytes)
    write_document(run_dir / CONFIG_FILE, RUN_CONFIG, config)
    atomic_write_text(run_dir / TOKENIZER_FILE, tokenizer_json)
    if trainer_state is not None:
        trainer_bytes = st_save({k: np.ascontiguousarray(v)
                                 for k, v in (trainer_arrays or {}).items()})
        atomic_write_bytes(run_dir / TRAINER_FILE, trainer_bytes)
        state = dict(trainer_state, model_sha256=_sha256(model_bytes),
                     trainer_sha256=_sha256(trainer_bytes))
        atomic_write_text(run_dir / TRAINER_JSON, json.dumps(state, indent=2))


def _read(path: Path, what: str) -> bytes:
    """A file of the checkpoint; its absence is a checkpoint missing a piece."""
    return read_bytes(path, f"checkpoint is missing {path.name} (looked for {path})", what)


def parse_safetensors(data: bytes, where: str | Path,
                      load: Callable[[bytes], dict[str, Any]] = st_load) -> dict[str, Any]:
    """The tensors of a safetensors file's bytes (`load`: safetensors.numpy.load by default, or
    safetensors.torch.load for dtypes NumPy lacks); one UserError line when it is not one."""
    try:
        return load(data)
    except (SafetensorError, ValueError, json.JSONDecodeError) as e:
        raise UserError(f"{where} is not a valid safetensors file ({e})") from None


def load_config(run_dir: str | Path) -> dict[str, Any]:
    """The run's config.json: {"format": "sheepop-run", "version": 1, "model": ..., ...}."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserError(f"run directory not found: {run_dir}")
    path = run_dir / CONFIG_FILE
    return read_document(path, RUN_CONFIG, f"checkpoint is missing {CONFIG_FILE} (looked for "
                                           f"{path})")


def load_weights(run_dir: str | Path) -> dict[str, np.ndarray]:
    path = Path(run_dir) / MODEL_FILE
    return parse_safetensors(_read(path, "weights"), path)


def load_tokenizer_json(run_dir: str | Path) -> str:
    path = Path(run_dir) / TOKENIZER_FILE
    return decode_text(_read(path, "tokenizer"), str(path), "tokenizer")


def load_trainer_state(run_dir: str | Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Optimizer arrays and trainer JSON, checked against the hashes recorded at save time."""
    run_dir = Path(run_dir)
    json_path = run_dir / TRAINER_JSON
    state = parse_json(_read(json_path, "trainer state"), str(json_path))
    if not isinstance(state, dict):
        raise UserError(f"{json_path} is not a JSON object")
    model_bytes = _read(run_dir / MODEL_FILE, "weights")
    trainer_bytes = _read(run_dir / TRAINER_FILE, "trainer state")
    if (state.get("model_sha256") != _sha256(model_bytes)
            or state.get("trainer_sha256") != _sha256(trainer_bytes)):
        raise UserError(f"checkpoint in {run_dir} is inconsistent (its files come from different "
                        "steps, probably a crash while saving); cannot resume from it")
    return parse_safetensors(trainer_bytes, run_dir / TRAINER_FILE), state
