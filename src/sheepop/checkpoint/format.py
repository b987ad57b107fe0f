"""The checkpoint format shared by both engines (see docs/architecture.md, "Checkpoints").

Weights are plain NumPy float32 arrays keyed by the parameter names both engines use; files are
safetensors and JSON, so loading a user's checkpoint never runs code (no pickle). `trainer.json`
records the SHA-256 of the weight files, so a checkpoint torn some other way is still detected.

A save replaces the checkpoint's files all together or not at all, and a reader reads only the
files of a committed checkpoint: sheepop.checkpoint.commit, which also names the files (its
names are re-exported here, so `checkpoint.MODEL_FILE`, `checkpoint.recover` work).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load as st_load

from sheepop.checkpoint.check import MAX_CONFIG_BYTES, check_weights_file, weights_from_bytes
from sheepop.checkpoint.commit import (  # noqa: F401 (re-exported: checkpoint.X for callers)
    BEST_DIR,
    BEST_JSON,
    CHECKPOINT_FILES,
    COMMIT_FILE,
    CONFIG_FILE,
    KEPT_DIR,
    MODEL_FILE,
    STAGING_DIR,
    TOKENIZER_FILE,
    TRAINER_FILE,
    TRAINER_JSON,
    FileData,
    SaveFailed,
    commit_files,
    current_path,
    describe_os_error,
    holds_checkpoint,
    recover,
    sha256_hex,
)
from sheepop.checkpoint.tensor_file import safetensors_parts
from sheepop.errors import UserError
from sheepop.files import (
    MAX_JSON_BYTES,
    DocumentFormat,
    decode_text,
    document_text,
    parse_json,
    read_bytes,
    read_document,
    shown,
)

FORMAT = "sheepop-run"
VERSION = 1
RUN_CONFIG = DocumentFormat(FORMAT, VERSION, "sheepop run config")


def save_checkpoint(run_dir: str | Path, weights: dict[str, np.ndarray], config: dict[str, Any],
                    tokenizer_json: str, trainer_arrays: dict[str, np.ndarray] | None = None,
                    trainer_state: dict[str, Any] | None = None) -> None:
    """Write a checkpoint into `run_dir` (weights always; trainer state when given), all
    together or not at all; `SaveFailed` when the system refuses (e.g. disk full)."""
    commit_files(Path(run_dir), checkpoint_files(weights, config, tokenizer_json, trainer_arrays,
                                                 trainer_state))


def checkpoint_files(weights: dict[str, np.ndarray], config: dict[str, Any], tokenizer_json: str,
                     trainer_arrays: dict[str, np.ndarray] | None = None,
                     trainer_state: dict[str, Any] | None = None) -> dict[str, FileData]:
    """The files of a checkpoint, by name: the model's three, and the trainer state's two when
    it is given (its JSON then records the SHA-256 of both weight files). The weight files are
    their parts (sheepop.checkpoint.tensor_file), views of the arrays given."""
    model_file = safetensors_parts({k: np.asarray(v, dtype=np.float32)
                                    for k, v in weights.items()}, metadata={"format": FORMAT})
    files = {MODEL_FILE: model_file,
             CONFIG_FILE: document_text(RUN_CONFIG, config).encode("utf-8"),
             TOKENIZER_FILE: tokenizer_json.encode("utf-8")}
    if trainer_state is not None:
        trainer_file = safetensors_parts(trainer_arrays or {})
        state = dict(trainer_state, model_sha256=sha256_hex(model_file),
                     trainer_sha256=sha256_hex(trainer_file))
        files[TRAINER_FILE] = trainer_file
        files[TRAINER_JSON] = json.dumps(state, indent=2).encode("utf-8")
    return files


# ----- loading ----------------------------------------------------------------------------------


def _read(run_dir: Path, name: str, what: str, limit: int | None = None
          ) -> tuple[Path, bytes]:
    """The current version of one file of the checkpoint and where it was read; its absence is
    a checkpoint missing a piece. Regular files only, of at most `limit` bytes
    (`files.read_bytes`: a FIFO or a link to /dev/zero is refused before it is read)."""
    path = current_path(run_dir, name)
    if path.parent != run_dir:
        try:
            return path, read_bytes(path, None, what, limit)
        except UserError:
            if path.exists():
                raise
        path = run_dir / name  # moved into place by the writer while we looked
    return path, read_bytes(path, f"checkpoint is missing {name} (looked for {path})", what,
                            limit)


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
    path = current_path(run_dir, CONFIG_FILE)
    return read_document(path, RUN_CONFIG, f"checkpoint is missing {CONFIG_FILE} (looked for "
                                           f"{path})", limit=MAX_CONFIG_BYTES)


def load_weights(run_dir: str | Path) -> dict[str, np.ndarray]:
    """The float32 weights, checked (sheepop.checkpoint.check: header, dtypes, finite); the
    header first, so a file padded past its tensors is refused unread."""
    check_weights_file(current_path(Path(run_dir), MODEL_FILE))
    path, data = _read(Path(run_dir), MODEL_FILE, "weights")
    return weights_from_bytes(data, path)


def load_tokenizer_json(run_dir: str | Path) -> str:
    path, data = _read(Path(run_dir), TOKENIZER_FILE, "tokenizer", MAX_JSON_BYTES)
    return decode_text(data, str(path), "tokenizer")


def load_trainer_state(run_dir: str | Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Optimizer arrays and trainer JSON, checked against the hashes recorded at save time."""
    run_dir = Path(run_dir)
    json_path, json_bytes = _read(run_dir, TRAINER_JSON, "trainer state", MAX_JSON_BYTES)
    state = parse_json(json_bytes, str(json_path))
    if not isinstance(state, dict):
        raise UserError(f"{json_path} is not a JSON object")
    if type(state.get("step")) is not int or state["step"] < 0:
        raise UserError(f"{json_path}: \"step\" is not a step number")
    _check_numbers(state, json_path)
    _, model_bytes = _read(run_dir, MODEL_FILE, "weights")
    trainer_path, trainer_bytes = _read(run_dir, TRAINER_FILE, "trainer state")
    if (state.get("model_sha256") != sha256_hex(model_bytes)
            or state.get("trainer_sha256") != sha256_hex(trainer_bytes)):
        raise UserError(f"checkpoint in {run_dir} is inconsistent (its files come from different "
                        "steps, probably a crash while saving); cannot resume from it")
    return parse_safetensors(trainer_bytes, trainer_path), state


# trainer.json's other numbers: name -> (what it must be, the test). Python's JSON reads NaN and
# Infinity, and a NaN best_val_loss was resumed as "best nan": no later loss is lower than it.
_COUNT = ("a count >= 0", lambda v: type(v) is int and v >= 0)
_NUMBERS = {
    "adam_step": _COUNT, "evals_since_best": _COUNT,
    "best_step": ("a step number or null", lambda v: v is None or _COUNT[1](v)),
    "best_val_loss": ("a finite loss >= 0 or null",
                      lambda v: v is None or _real(v) and 0 <= v < math.inf),
    "grad_scale": ("a finite number > 0 or null",
                   lambda v: v is None or _real(v) and 0 < v < math.inf),
}


def _real(value: Any) -> bool:
    return type(value) in (int, float)


def _check_numbers(state: dict[str, Any], json_path: Path) -> None:
    """Each number trainer.json may hold is what a save writes, or one UserError line."""
    for name, (what, ok) in _NUMBERS.items():
        if name in state and not ok(state[name]):
            raise UserError(f"{json_path}: \"{name}\" is {shown(state[name])}, not {what}; the "
                            "checkpoint is damaged")
