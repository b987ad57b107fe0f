"""A run directory's files, and a checkpoint's save into it all together or not at all (see
docs/architecture.md, "Checkpoints"; what the files hold is sheepop.checkpoint.format).

A checkpoint is several files (model, config, tokenizer, trainer state, trainer JSON) and a save
replaces them together or not at all (`commit_files`):

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
tokenizer never change), and `sheepop.checkpoint.format.load_trainer_state` checks the weights
against the trainer state's hashes.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from sheepop.errors import UserError
from sheepop.files import DocumentFormat, check_own_entry, document_text, parse_document

# The names of a run directory's files live here, below sheepop.checkpoint.format (which re-exports
# them): recovery must know them (a commit record moves only these; only their temporary
# files are removed).
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
IOV_MAX = 1024  # the parts one writev may take (POSIX guarantees 16; Linux and macOS take 1024)


class SaveFailed(UserError):
    """A save stopped by the operating system (disk full, I/O error). `committed`: the new
    checkpoint is durable and recovery installs it; otherwise it was dropped and the previous
    checkpoint is intact. `reason` is the system's words."""

    def __init__(self, run_dir: Path, reason: str, committed: bool):
        self.run_dir, self.reason, self.committed = run_dir, reason, committed
        kept = ("the new checkpoint is committed and is completed on the next start"
                if committed else "the previous checkpoint there is intact")
        super().__init__(f"saving a checkpoint in {run_dir} failed: {reason}; {kept}")


class Parts(tuple):
    """A file's bytes as the parts written one after the other (a safetensors file's header and
    each tensor's own memory: sheepop.checkpoint.tensor_file.safetensors_parts), so that a
    checkpoint of a large model is never copied into one more buffer of its size. Its SHA-256
    is computed once: trainer.json records it, then the commit record (a SmolLM2 checkpoint's
    two passes over 1.6 GB cost 1.2 s each)."""

    @functools.cached_property
    def sha256(self) -> str:
        digest = hashlib.sha256()
        for part in self:
            digest.update(part)
        return digest.hexdigest()


FileData = bytes | Parts


def parts(data: FileData) -> Sequence[bytes | memoryview]:
    """`data` as a sequence of parts (whole bytes: one part)."""
    return (data,) if isinstance(data, bytes) else data


def sha256_hex(data: FileData) -> str:
    """The SHA-256 of `data` (all its parts, in order), as 64 hexadecimal digits."""
    return data.sha256 if isinstance(data, Parts) else hashlib.sha256(data).hexdigest()


# ----- the save: stage, commit, install ---------------------------------------------------------


def commit_files(run_dir: Path, files: dict[str, FileData]) -> None:
    """Replace `files` (names of CHECKPOINT_FILES -> their bytes) in `run_dir` all together or
    not at all (the protocol in the module's docstring)."""
    staging = run_dir / STAGING_DIR
    check_own_entry(staging, directory=True)  # a link there: its target would be deleted
    try:
        if not run_dir.is_dir():
            run_dir.mkdir(parents=True)
        _settle(run_dir)  # a save interrupted earlier in this process
        os.mkdir(staging)
        for name, data in files.items():
            _write_synced(staging / name, data)
        _fsync_dir(staging)
        record = {"files": {name: sha256_hex(data) for name, data in files.items()}}
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


def _write_synced(path: Path, data: FileData) -> None:
    """A new file holding `data`, flushed to the disk (mode 0666 less the umask)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        views = [v for v in (memoryview(p).cast("B") for p in parts(data)) if v.nbytes]
        while views:  # one system call for many parts; a call may write only some of them
            written = os.writev(fd, views[:IOV_MAX])
            while written:
                if written >= views[0].nbytes:
                    written -= views.pop(0).nbytes
                else:
                    views[0], written = views[0][written:], 0
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


def check_run_entries(run_dir: str | Path) -> None:
    """Refuse (one UserError line) a run directory holding a symbolic link, or a thing of the
    wrong kind (a FIFO, a device, a folder), where one of its own files or folders belongs: the
    run's files (RUN_FILES), the staging folder and what it holds, best/ (and the same inside
    it) and checkpoints/ with its step folders. The writer deletes and replaces these, so a
    link would carry those deletions and writes outside the run; a FIFO would block its reads.
    The run directory itself may be a link (`--out` names it as the user likes)."""
    run_dir = Path(run_dir)
    for name in RUN_FILES:
        check_own_entry(run_dir / name)
    for folder in (STAGING_DIR, BEST_DIR, KEPT_DIR):
        check_own_entry(run_dir / folder, directory=True)
    staging, best, kept = run_dir / STAGING_DIR, run_dir / BEST_DIR, run_dir / KEPT_DIR
    if staging.is_dir():
        for entry in staging.iterdir():  # staged files move into the run: regular ones only
            check_own_entry(entry)
    if best.is_dir():
        for name in (BEST_JSON, *CHECKPOINT_FILES):
            check_own_entry(best / name)
        check_own_entry(best / STAGING_DIR, directory=True)
        if (best / STAGING_DIR).is_dir():
            for entry in (best / STAGING_DIR).iterdir():
                check_own_entry(entry)
    if kept.is_dir():
        for entry in kept.iterdir():
            if entry.name.startswith(("step-", ".step-")):
                check_own_entry(entry, directory=True)


def recover(run_dir: str | Path) -> None:
    """Bring `run_dir` (and its best/ folder) to its last committed checkpoint: install a
    committed save, delete an uncommitted one and the temporary files of interrupted atomic
    writes and of a checkpoints/ copy being made. Only the writer (the holder of the run's
    lock) calls it, before it reads the run; it first refuses a run holding links where its
    own files belong (`check_run_entries`)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return
    try:
        check_run_entries(run_dir)
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
