"""The checkpoint format shared by both engines (see docs/architecture.md, "Checkpoints").

Weights are plain NumPy float32 arrays keyed by the parameter names both engines use; files are
safetensors and JSON, so loading a user's checkpoint never runs code (no pickle). `trainer.json`
records the SHA-256 of the weight files, so a checkpoint torn some other way is still detected.

All or nothing. A checkpoint is several files (model, config, tokenizer, trainer state, trainer
JSON) and a save replaces them together or not at all (`commit_files`):

    1. stage    every new file in run_dir/.checkpoint-staging/, each fsync'ed, then the folder
    2. commit   write .checkpoint-staging/COMMIT.json (the file names and their SHA-256) with an
                atomic write (temporary name, fsync, rename): the single moment the new
                checkpoint becomes the current one
    3. install  rename each staged file over its name in run_dir, fsync run_dir, delete the
                commit record, remove the staging folder

The files in run_dir are the previous complete checkpoint until step 2 and the new one after
step 3. Recovery (`recover`, run by the writer holding the run's lock before it reads anything)
finishes an interrupted save: a staging folder WITH its commit record is installed (step 3
again, each rename done at most once), one WITHOUT it is deleted, and the stray `.NAME.*.tmp`
files of interrupted atomic writes of a run's files (RUN_FILES) are removed. A reader that is not
the writer (`generate` while a run trains) never changes the directory: each file is read from
the staging folder when a commit record lists it and it is still there, else from run_dir
(`current_path`), so every file read belongs to a committed checkpoint. Files of consecutive
checkpoints of one run differ only in the weights and trainer state (the model's shape and the
tokenizer never change), and `load_trainer_state` checks the weights against the trainer
state's hashes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from sheepop.checkpoint_check import MAX_CONFIG_BYTES, weights_from_bytes
from sheepop.errors import UserError
from sheepop.files import (
    MAX_JSON_BYTES,
    DocumentFormat,
    decode_text,
    document_text,
    parse_document,
    parse_json,
    read_bytes,
    read_document,
)

FORMAT = "sheepop-run"
VERSION = 1
RUN_CONFIG = DocumentFormat(FORMAT, VERSION, "sheepop run config")
MODEL_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.json"
TRAINER_FILE = "trainer.safetensors"
TRAINER_JSON = "trainer.json"
CHECKPOINT_FILES = (MODEL_FILE, CONFIG_FILE, TOKENIZER_FILE, TRAINER_FILE, TRAINER_JSON)
# What a run keeps besides its latest checkpoint (sheepop.train.keeping): the model of the best
# validation loss in BEST_DIR (the three model files and BEST_JSON, saved like a checkpoint),
# and with train.keep_last > 1 the newest checkpoints in KEPT_DIR/step-NNNNNNN/.
BEST_DIR = "best"
BEST_JSON = "best.json"
KEPT_DIR = "checkpoints"
# Files of a run written through sheepop.files.atomic_open, whose temporary names (".NAME.*.tmp")
# a crash can leave behind; recovery removes those and no other file of the directory.
RUN_FILES = (*CHECKPOINT_FILES, "metrics.jsonl", "loss.png", "lr.png")
STAGING_DIR = ".checkpoint-staging"
COMMIT_FILE = "COMMIT.json"
COMMIT = DocumentFormat("sheepop-checkpoint-commit", 1, "sheepop checkpoint commit record")


class SaveFailed(UserError):
    """A save stopped by the operating system (disk full, I/O error). `committed`: the new
    checkpoint is durable and recovery installs it; otherwise it was dropped and the previous
    checkpoint is intact. `reason` is the system's words."""

    def __init__(self, run_dir: Path, reason: str, committed: bool):
        self.run_dir, self.reason, self.committed = run_dir, reason, committed
        kept = ("the new checkpoint is committed and is completed on the next start"
                if committed else "the previous checkpoint there is intact")
        super().__init__(f"saving a checkpoint in {run_dir} failed: {reason}; {kept}")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def save_checkpoint(run_dir: str | Path, weights: dict[str, np.ndarray], config: dict[str, Any],
                    tokenizer_json: str, trainer_arrays: dict[str, np.ndarray] | None = None,
                    trainer_state: dict[str, Any] | None = None) -> None:
    """Write a checkpoint into `run_dir` (weights always; trainer state when given), all
    together or not at all; `SaveFailed` when the system refuses (e.g. disk full)."""
    commit_files(Path(run_dir), checkpoint_files(weights, config, tokenizer_json, trainer_arrays,
                                                 trainer_state))


def checkpoint_files(weights: dict[str, np.ndarray], config: dict[str, Any], tokenizer_json: str,
                     trainer_arrays: dict[str, np.ndarray] | None = None,
                     trainer_state: dict[str, Any] | None = None) -> dict[str, bytes]:
    """The files of a checkpoint, by name: the model's three, and the trainer state's two when
    it is given (its JSON then records the SHA-256 of both weight files)."""
    model_bytes = st_save({k: np.ascontiguousarray(v, dtype=np.float32)
                           for k, v in weights.items()}, metadata={"format": FORMAT})
    files = {MODEL_FILE: model_bytes,
             CONFIG_FILE: document_text(RUN_CONFIG, config).encode("utf-8"),
             TOKENIZER_FILE: tokenizer_json.encode("utf-8")}
    if trainer_state is not None:
        trainer_bytes = st_save({k: np.ascontiguousarray(v)
                                 for k, v in (trainer_arrays or {}).items()})
        state = dict(trainer_state, model_sha256=_sha256(model_bytes),
                     trainer_sha256=_sha256(trainer_bytes))
        files[TRAINER_FILE] = trainer_bytes
        files[TRAINER_JSON] = json.dumps(state, indent=2).encode("utf-8")
    return files


# ----- the save: stage, commit, install ---------------------------------------------------------


def commit_files(run_dir: Path, files: dict[str, bytes]) -> None:
    """Replace `files` (names of CHECKPOINT_FILES -> bytes) in `run_dir` all together or not at
    all (the protocol in the module's docstring)."""
    staging = run_dir / STAGING_DIR
    try:
        if not run_dir.is_dir():
            run_dir.mkdir(parents=True)
        _settle(run_dir)  # a save interrupted earlier in this process
        os.mkdir(staging)
        for name, data in files.items():
            _write_synced(staging / name, data)
        _fsync_dir(staging)
        record = {"files": {name: _sha256(data) for name, data in files.items()}}
        _write_synced(staging / f".{COMMIT_FILE}.tmp", document_text(COMMIT, record).encode())
        os.replace(staging / f".{COMMIT_FILE}.tmp", staging / COMMIT_FILE)  # the commit
        _fsync_dir(staging)
    except BaseException as e:
        committed = bool(_committed(run_dir))
        if not committed:
            _discard(staging)  # frees the space a full disk needs; the old checkpoint stands
        if isinstance(e, OSError):
            raise SaveFailed(run_dir, describe_os_error(e), committed) from None
        raise
    try:
        _install(run_dir, list(files))
    except OSError as e:
        raise SaveFailed(run_dir, describe_os_error(e), True) from None


def _write_synced(path: Path, data: bytes) -> None:
    """A new file holding `data`, flushed to the disk (mode 0666 less the umask)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    """Make the names in a folder durable (a rename is only on disk once its folder is)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _install(run_dir: Path, names: list[str]) -> None:
    """Step 3: move the committed files into place, then forget the staging folder."""
    staging = run_dir / STAGING_DIR
    for name in names:
        if (staging / name).exists():  # absent: already moved by an interrupted install
            os.replace(staging / name, run_dir / name)
    _fsync_dir(run_dir)
    (staging / COMMIT_FILE).unlink(missing_ok=True)
    shutil.rmtree(staging)


def _discard(staging: Path) -> None:
    """Delete an uncommitted staging folder, as far as the system lets us (recovery finishes)."""
    shutil.rmtree(staging, ignore_errors=True)


def describe_os_error(e: OSError) -> str:
    """The system's words for a failed file operation, saying so when the disk is full."""
    words = e.strerror or str(e) or type(e).__name__
    return f"{words} (the disk is full)" if e.errno in _DISK_FULL else words


_DISK_FULL = {28, 122}  # ENOSPC, EDQUOT (Linux)


# ----- recovery and the current files -----------------------------------------------------------


def _committed(run_dir: Path) -> list[str]:
    """The files a committed staging folder holds the current version of ([] when none)."""
    path = run_dir / STAGING_DIR / COMMIT_FILE
    try:
        record = parse_document(path.read_bytes(), COMMIT, str(path))
    except (OSError, UserError):
        return []  # no record (or not one this sheepop wrote): nothing was committed
    names = record.get("files")
    # Only the checkpoint's own names: a record can never move any other file.
    return [n for n in (*CHECKPOINT_FILES, BEST_JSON) if isinstance(names, dict) and n in names]


def _settle(run_dir: Path) -> None:
    """Finish (committed) or drop (not committed) a save that was interrupted."""
    if not (run_dir / STAGING_DIR).exists():
        return
    names = _committed(run_dir)
    if names:
        _install(run_dir, names)
    else:
        _discard(run_dir / STAGING_DIR)
        if (run_dir / STAGING_DIR).exists():
            raise OSError(f"cannot remove {run_dir / STAGING_DIR}")


def recover(run_dir: str | Path) -> None:
    """Bring `run_dir` (and its best/ folder) to its last committed checkpoint: install a
    committed save, delete an uncommitted one and the temporary files of interrupted atomic
    writes and of a checkpoints/ copy being made. Only the writer (the holder of the run's
    lock) calls it, before it reads the run."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return
    try:
        _settle(run_dir)
        if (run_dir / BEST_DIR).is_dir():
            _settle(run_dir / BEST_DIR)
        for path in (run_dir / KEPT_DIR).glob(".step-*.tmp"):  # a copy being linked (keeping.py)
            shutil.rmtree(path)
        for path in run_dir.glob(".*.tmp"):  # sheepop.files.atomic_open's temporary names,
            ours = any(path.name.startswith(f".{name}.") for name in RUN_FILES)  # ours only
            if ours and path.is_file():
                path.unlink(missing_ok=True)
    except OSError as e:
        why = describe_os_error(e)
        raise UserError(f"cannot recover the checkpoint in {run_dir}: {why}") from None


def current_path(run_dir: str | Path, name: str) -> Path:
    """Where the current version of checkpoint file `name` is: the staging folder while a
    committed save is being installed, run_dir otherwise."""
    run_dir = Path(run_dir)
    staged = run_dir / STAGING_DIR / name
    if name in _committed(run_dir) and staged.exists():
        return staged
    return run_dir / name


def holds_checkpoint(run_dir: str | Path) -> bool:
    """Whether `run_dir` holds a committed checkpoint (a save that never committed does not
    count: such a directory can be started afresh)."""
    return current_path(run_dir, MODEL_FILE).is_file()


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
    """The float32 weights, checked (sheepop.checkpoint_check: header, dtypes, finite)."""
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
    _, model_bytes = _read(run_dir, MODEL_FILE, "weights")
    trainer_path, trainer_bytes = _read(run_dir, TRAINER_FILE, "trainer state")
    if (state.get("model_sha256") != _sha256(model_bytes)
            or state.get("trainer_sha256") != _sha256(trainer_bytes)):
        raise UserError(f"checkpoint in {run_dir} is inconsistent (its files come from different "
                        "steps, probably a crash while saving); cannot resume from it")
    return parse_safetensors(trainer_bytes, trainer_path), state
