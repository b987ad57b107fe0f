"""Files that a crash cannot tear, and the versioned JSON documents sheepop writes.

Atomic writes. A file is written under a temporary name in its own directory, flushed to disk
(fsync), then renamed over the target (`os.replace`, atomic on POSIX and Windows): a reader sees
the old file or the new one, never half of one, and a write that fails leaves the old file as it
was and no temporary file behind. The new file gets the mode an ordinary `open()` would give it,
0666 & ~umask (mkstemp alone would leave it 0600).

Versioned JSON documents. Every JSON file sheepop owns is one object that names itself:

    {"format": "sheepop-tokenizer", "version": 1, ...what the format holds}

`DocumentFormat` binds the "format" tag, the version this sheepop writes (the newest it reads)
and the name error messages give such a file. `write_document` writes one; `read_document` /
`parse_document` read one back (`read_fields` then builds an object of its fields), and every
way that can fail is one `UserError` line:

    missing file           the caller's message (e.g. "... make it with `sheepop prepare`")
    a directory, unreadable, not UTF-8, not JSON, not an object, another "format",
    no version (a positive integer), a version newer than this sheepop reads ("upgrade sheepop")

`read_bytes`, `read_text` and `read_json` are the same reader for files that are not sheepop
documents (weights, Hugging Face or GPT-2 files): the same messages, without the format checks.

Hostile files. Every reader here reads only a regular file, and one no larger than its limit:
`open_regular` refuses a FIFO, a device (a symlink to /dev/zero included), a socket or a
directory with one line, before reading a byte. It checks with `os.stat` before opening (opening
some devices has effects) and with `os.fstat` on what it opened (the file may have been swapped
in between); it opens with O_NONBLOCK, so even a FIFO swapped in at that moment cannot block the
open. JSON is read whole, so it has a size cap (`MAX_JSON_BYTES`, or the caller's), and nesting
too deep for the parser (Python's recursion limit, ~1000 levels) is one line, not a
RecursionError.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar

from sheepop.errors import UserError


def _read_umask() -> int:
    mask = os.umask(0)  # the only way to read it is to set it; done once, at import
    os.umask(mask)
    return mask


_UMASK = _read_umask()

# O_NONBLOCK: opening a FIFO for reading blocks until a writer comes, without it (POSIX only).
_OPEN_FLAGS = getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)

# The largest JSON file read whole: 64 MiB, more than any real tokenizer.json (a 256k-token
# vocabulary with its merges is ~30 MB); callers with smaller files pass their own limit.
MAX_JSON_BYTES = 64 * 2**20


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "wb") -> Iterator[IO[Any]]:
    """A file to write `path` through ("wb", or "w" for UTF-8 text): it replaces `path` when
    the block ends normally; on an exception `path` keeps its old content (or stays absent)."""
    if mode not in ("wb", "w"):
        raise ValueError(f"atomic_open writes with mode 'wb' or 'w', not {mode!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp, 0o666 & ~_UMASK)
        with os.fdopen(fd, mode, **({"encoding": "utf-8"} if mode == "w" else {})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file in the same directory and a rename."""
    with atomic_open(path, "wb") as f:
        f.write(data)


def atomic_write_text(path: str | Path, text: str) -> None:
    """`atomic_write_bytes` of `text` in UTF-8."""
    atomic_write_bytes(path, text.encode("utf-8"))


@dataclass(frozen=True)
class DocumentFormat:
    """One kind of sheepop JSON document."""

    tag: str      # the value of its "format" field, e.g. "sheepop-tokenizer"
    version: int  # the version this sheepop writes, and the newest it reads
    title: str    # how messages name such a file, e.g. "sheepop tokenizer file"


def document_text(fmt: DocumentFormat, body: dict[str, Any], indent: int = 2) -> str:
    """The JSON text of a document: "format" and "version" first, then `body`, then a newline."""
    data = {"format": fmt.tag, "version": fmt.version, **body}
    data.update(format=fmt.tag, version=fmt.version)  # the body cannot disguise the document
    return json.dumps(data, ensure_ascii=False, indent=indent) + "\n"


def write_document(path: str | Path, fmt: DocumentFormat, body: dict[str, Any],
                   indent: int = 2) -> None:
    """Write a document atomically."""
    atomic_write_text(path, document_text(fmt, body, indent))


def shown(value: Any, width: int = 60) -> str:
    """`repr(value)` cut to `width` characters: a value read from a hostile file can be
    megabytes long, and a message stays one short line."""
    text = repr(value)
    return text if len(text) <= width else text[:width - 3] + "..."


def _file_kind(mode: int) -> str | None:
    """What a file that is not a regular file is, for messages (None: a regular file)."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return None if stat.S_ISREG(mode) else "not a regular file"


def _check_regular(st: os.stat_result, path: Path, what: str, limit: int | None) -> None:
    kind = _file_kind(st.st_mode)
    if kind is not None:
        raise UserError(f"{path} is {kind}, not a {what}: sheepop reads only regular files")
    if limit is not None and st.st_size > limit:
        raise UserError(f"{path} is {st.st_size:,} bytes, more than a {what} may be "
                        f"({limit:,} bytes)")


_NO_FOLLOW = getattr(os, "O_NOFOLLOW", 0)


def check_own_entry(path: str | Path, directory: bool = False) -> None:
    """Refuse (one UserError line) `path` when it is a symbolic link, or not a regular file
    (`directory`: not a folder); nothing when it does not exist. For the files and folders a
    run directory owns: sheepop deletes and replaces them, so a link there would make it delete
    or overwrite what the link points to, outside the run."""
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise UserError(f"cannot use {path}: {e.strerror}") from None
    own = "folder" if directory else "file"
    if stat.S_ISLNK(st.st_mode):
        try:
            target = f" (to {shown(os.readlink(path))})"
        except OSError:
            target = ""
        raise UserError(f"{path} is a symbolic link{target} where the run keeps its own {own}: "
                        "sheepop follows no link inside a run directory (replace the link by "
                        "what it points to, or remove it)")
    if not (stat.S_ISDIR if directory else stat.S_ISREG)(st.st_mode):
        kind = _file_kind(st.st_mode) or "a regular file"
        raise UserError(f"{path} is {kind}, where the run keeps its own {own}: remove it")


def check_one_name(fd: int, path: str | Path) -> None:
    """Refuse (one UserError line) the open file `fd` of `path` when it has another name too (a
    hard link: `ln OUTSIDE run/train.lock`): a run's file written in place would be written
    under that other name as well, outside the run. (A file replaced by a rename, as a
    checkpoint's are, may have other names: the rename leaves them as they were.)"""
    links = os.fstat(fd).st_nlink
    if links > 1:
        os.close(fd)
        raise UserError(f"{path} has {links} names (a hard link to a file elsewhere), where the "
                        "run keeps its own file: sheepop writes it in place only when the run "
                        "alone names it (remove it from the run)")


def _own_copy(path: Path) -> None:
    """Give `path` a file of its own: its content copied, renamed over it (its other names keep
    the old file, unchanged)."""
    with os.fdopen(_open_own(path, os.O_RDONLY), "rb") as f:
        data = f.read()
    atomic_write_bytes(path, data)


def _open_own(path: Path, flags: int) -> int:
    """A descriptor of `path` opened with `flags`, checked by `check_own_entry`'s rules."""
    try:
        fd = os.open(path, flags | _NO_FOLLOW | _OPEN_FLAGS, 0o666)
    except OSError:
        if os.path.islink(path):
            check_own_entry(path)  # raises, naming the link
        raise
    kind = _file_kind(os.fstat(fd).st_mode)
    if kind is not None:
        os.close(fd)
        raise UserError(f"{path} is {kind}, where the run keeps its own file: remove it")
    return fd


def open_own_append(path: str | Path) -> IO[str]:
    """`path` opened to append UTF-8 text, created if absent, never through a symbolic link and
    only when it is a regular file (`check_own_entry`'s rules, checked on what was opened: a
    FIFO cannot block the open, O_NONBLOCK); one UserError line otherwise. A file with another
    name (a hard link, e.g. a `cp -al` backup of the run) is first replaced by a copy of its
    own, so that the other name never changes."""
    path = Path(path)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
    fd = _open_own(path, flags)
    if os.fstat(fd).st_nlink > 1:
        os.close(fd)
        _own_copy(path)
        fd = _open_own(path, flags)
        check_one_name(fd, path)  # linked again meanwhile: refused
    return os.fdopen(fd, "a", encoding="utf-8")


@contextlib.contextmanager
def open_regular(path: str | Path, missing: str | None = None, what: str = "file",
                 limit: int | None = None) -> Iterator[IO[bytes]]:
    """`path` opened for reading in binary, after checking that it is a regular file of at most
    `limit` bytes (one UserError line otherwise; `missing`: the message when it does not
    exist)."""
    path = Path(path)
    try:
        _check_regular(os.stat(path), path, what, limit)
        fd = os.open(path, os.O_RDONLY | _OPEN_FLAGS)
    except FileNotFoundError:
        raise UserError(missing or f"{what} not found: {path}") from None
    except IsADirectoryError:
        raise UserError(f"{path} is a directory, not a {what}") from None
    except OSError as e:
        raise UserError(f"cannot read {what} {path}: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        _check_regular(os.fstat(fd), path, what, limit)
        yield f


def read_bytes(path: str | Path, missing: str | None = None, what: str = "file",
               limit: int | None = None) -> bytes:
    """The bytes of `path`, a regular file of at most `limit` bytes (`open_regular`); `missing`
    is the message when it does not exist (default: "<what> not found: <path>"), `what` names
    the file in the other messages."""
    with open_regular(path, missing, what, limit) as f:
        try:
            data = f.read() if limit is None else f.read(limit + 1)
        except OSError as e:
            raise UserError(f"cannot read {what} {path}: {e.strerror}") from None
    if limit is not None and len(data) > limit:  # it grew after the check
        raise UserError(f"{path} is more than {limit:,} bytes, more than a {what} may be")
    return data


def decode_text(data: bytes, where: str, what: str = "file") -> str:
    """`data` as UTF-8 text; UserError naming `where` when it is not."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{where}: the {what} is not UTF-8 text") from None


def read_text(path: str | Path, missing: str | None = None, what: str = "file",
              limit: int | None = None) -> str:
    """The UTF-8 text of `path` (messages and `limit` as in `read_bytes`)."""
    return decode_text(read_bytes(path, missing, what, limit), str(path), what)


def parse_json(text: str | bytes, where: str) -> Any:
    """The JSON value of `text` (any shape); UserError naming `where` when it is not JSON."""
    try:
        return json.loads(text)
    except UnicodeDecodeError:
        raise UserError(f"{where}: the file is not UTF-8 text") from None
    except RecursionError:
        raise UserError(f"{where} is not a JSON file sheepop reads (nested too deeply)") from None
    except (json.JSONDecodeError, TypeError, ValueError) as e:  # ValueError: a 5000-digit int
        raise UserError(f"{where} is not valid JSON ({str(e)[:200]})") from None


def read_json(path: str | Path, missing: str | None = None, what: str = "file",
              limit: int = MAX_JSON_BYTES) -> Any:
    """The JSON value of the file at `path`, of any shape (for files sheepop does not own)."""
    return parse_json(read_text(path, missing, what, limit), str(path))


def parse_document(text: str | bytes, fmt: DocumentFormat, where: str,
                   hint: Callable[[Any], str] | None = None) -> dict[str, Any]:
    """The document in `text`, checked: a JSON object whose "format" is `fmt.tag` and whose
    version is a positive integer no newer than `fmt.version`. `where` names it in messages;
    `hint(data)` may add a clause to the wrong-format message (what the file looks like)."""
    data = parse_json(text, where)
    if not isinstance(data, dict) or data.get("format") != fmt.tag:
        found = data.get("format") if isinstance(data, dict) else None
        said = (f"its \"format\" is {shown(found)}" if found is not None
                else f"no \"format\": \"{fmt.tag}\"")
        more = hint(data) if hint is not None else ""
        raise UserError(f"{where} is not a {fmt.title} ({said}){more}")
    version = data.get("version")
    if type(version) is not int or version < 1:
        raise UserError(f"{where}: the {fmt.title} has no valid version number")
    if version > fmt.version:
        raise UserError(f"{where}: format version {version} is newer than this sheepop reads "
                        f"(up to {fmt.version}): upgrade sheepop")
    return data


def read_document(path: str | Path, fmt: DocumentFormat, missing: str | None = None,
                  hint: Callable[[Any], str] | None = None,
                  limit: int = MAX_JSON_BYTES) -> dict[str, Any]:
    """The document at `path` (see `parse_document`); `missing` is the message when the file
    does not exist, which should say how to make it; `limit`: its largest size in bytes."""
    return parse_document(read_text(path, missing, fmt.title, limit), fmt, str(path), hint)


T = TypeVar("T")


def read_fields(path: str | Path, fmt: DocumentFormat, missing: str,
                build: Callable[[dict[str, Any]], T]) -> T:
    """`build` of the document at `path` (see `read_document`): the object its fields make (a
    run's options). A field `build` finds missing (KeyError) or of the wrong type (TypeError;
    ValueError: int("x")) is one UserError naming it."""
    fields = read_document(path, fmt, missing)
    try:
        return build(fields)
    except (KeyError, TypeError, ValueError) as e:
        raise UserError(f"{path}: missing or bad field {e}") from None
