"""The checkpoint format shared by both engines (see docs/architecture.md, "Checkpoints").

Weights are plain NumPy float32 arrays keyed by the parameter names both engines use; files are
safetensors and JSON, so loading a user's checkpoint never runs code (no pickle). Every file is
written to a temporary name and renamed into place; `trainer.json`, written last, records the
SHA-256 of the weight files so a checkpoint torn by a crash is detected.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from sheepop.errors import UserError

FORMAT = "sheepop-run"
VERSION = 1
MODEL_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.json"
TRAINER_FILE = "trainer.safetensors"
TRAINER_JSON = "trainer.json"


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file in the same directory and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp creates the file 0600; give it the mode an ordinary open() would (0666 & ~umask)
        os.chmod(tmp, 0o666 & ~_UMASK)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _read_umask() -> int:
    mask = os.umask(0)  # the only way to read it is to set it; done once, at import
    os.umask(mask)
    return mask


_UMASK = _read_umask()


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


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
    atomic_write_text(run_dir / CONFIG_FILE,
                      json.dumps({"format": FORMAT, "version": VERSION, **config}, indent=2))
    atomic_write_text(run_dir / TOKENIZER_FILE, tokenizer_json)
    if trainer_state is not None:
        trainer_bytes = st_save({k: np.ascontiguousarray(v)
                                 for k, v in (trainer_arrays or {}).items()})
        atomic_write_bytes(run_dir / TRAINER_FILE, trainer_bytes)
        state = dict(trainer_state, model_sha256=_sha256(model_bytes),
                     trainer_sha256=_sha256(trainer_bytes))
        atomic_write_text(run_dir / TRAINER_JSON, json.dumps(state, indent=2))


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise UserError(f"checkpoint is missing {path.name} (looked for {path})") from None
    except OSError as e:
        raise UserError(f"cannot read {what} {path}: {e.strerror}") from None


def _load_safetensors(data: bytes, path: Path) -> dict[str, np.ndarray]:
    try:
        return st_load(data)
    except (SafetensorError, ValueError, json.JSONDecodeError) as e:
        raise UserError(f"{path} is not a valid safetensors file ({e})") from None


def read_json_file(path: str | Path, fmt: str, missing: str) -> dict[str, Any]:
    """A JSON object whose "format" is `fmt`; one clear UserError otherwise (`missing` is the
    message when the file does not exist)."""
    path = Path(path)
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise UserError(missing) from None
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path} is not valid JSON ({e})") from None
    if not isinstance(data, dict) or data.get("format") != fmt:
        raise UserError(f"{path} is not a {fmt} file")
    return data


def load_config(run_dir: str | Path) -> dict[str, Any]:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserError(f"run directory not found: {run_dir}")
    path = run_dir / CONFIG_FILE
    config = read_json_file(path, FORMAT, f"checkpoint is missing {CONFIG_FILE} (looked for "
                                          f"{path})")
    if config.get("version", 0) > VERSION:
        raise UserError(f"{path} has format version {config['version']}; this sheepop reads "
                        f"up to {VERSION}: upgrade sheepop")
    return config


def load_weights(run_dir: str | Path) -> dict[str, np.ndarray]:
    path = Path(run_dir) / MODEL_FILE
    return _load_safetensors(_read(path, "weights"), path)


def load_tokenizer_json(run_dir: str | Path) -> str:
    path = Path(run_dir) / TOKENIZER_FILE
    try:
        return _read(path, "tokenizer").decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{path} is not UTF-8 text") from None


def load_trainer_state(run_dir: str | Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Optimizer arrays and trainer JSON, checked against the hashes recorded at save time."""
    run_dir = Path(run_dir)
    json_path = run_dir / TRAINER_JSON
    try:
        state = json.loads(_read(json_path, "trainer state"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{json_path} is not valid JSON ({e})") from None
    model_bytes = _read(run_dir / MODEL_FILE, "weights")
    trainer_bytes = _read(run_dir / TRAINER_FILE, "trainer state")
    if (state.get("model_sha256") != _sha256(model_bytes)
            or state.get("trainer_sha256") != _sha256(trainer_bytes)):
        raise UserError(f"checkpoint in {run_dir} is inconsistent (its files come from different "
                        "steps, probably a crash while saving); cannot resume from it")
    return _load_safetensors(trainer_bytes, run_dir / TRAINER_FILE), state
