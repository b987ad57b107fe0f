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
`parse_document` read one back, and every way that can fail is one `UserError` line:

    missing file           the caller's message (e.g. "... make it with `sheepop prepare`")
    a directory, unreadable, not UTF-8, not JSON, not an object, another "format",
    no version (a positive integer), a version newer than this sheepop reads ("upgrade sheepop")

`read_bytes`, `read_text` and `read_json` are the same reader for files that are not sheepop
documents (weights, Hugging Face or GPT-2 files): the same messages, without the format checks.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from sheepop.errors import UserError


def _read_umask() -> int:
    mask = os.umask(0)  # the only way to read it is to set it; done once, at import
    os.umask(mask)
    return mask


_UMASK = _read_umask()


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


def read_bytes(path: str | Path, missing: str | None = None, what: str = "file") -> bytes:
    """The bytes of `path`; `missing` is the message when it does not exist (default:
    "<what> not found: <path>"), `what` names the file in the other messages."""
    path = Path(path)
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise UserError(missing or f"{what} not found: {path}") from None
    except IsADirectoryError:
        raise UserError(f"{path} is a directory, not a {what}") from None
    except OSError as e:
        raise UserError(f"cannot read {what} {path}: {e.strerror}") from None


def decode_text(data: bytes, where: str, what: str = "file") -> str:
    """`data` as UTF-8 text; UserError naming `where` when it is not."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{where}: the {what} is not UTF-8 text") from None


def read_text(path: str | Path, missing: str | None = None, what: str = "file") -> str:
    """The UTF-8 text of `path` (messages as in `read_bytes`)."""
    return decode_text(read_bytes(path, missing, what), str(path), what)


def parse_json(text: str | bytes, where: str) -> Any:
    """The JSON value of `text` (any shape); UserError naming `where` when it is not JSON."""
    try:
        return json.loads(text)
    except UnicodeDecodeError:
        raise UserError(f"{where}: the file is not UTF-8 text") from None
    except (json.JSONDecodeError, TypeError) as e:
        raise UserError(f"{where} is not valid JSON ({e})") from None


def read_json(path: str | Path, missing: str | None = None, what: str = "file") -> Any:
    """The JSON value of the file at `path`, of any shape (for files sheepop does not own)."""
    return parse_json(read_text(path, missing, what), str(path))


def parse_document(text: str | bytes, fmt: DocumentFormat, where: str,
                   hint: Callable[[Any], str] | None = None) -> dict[str, Any]:
    """The document in `text`, checked: a JSON object whose "format" is `fmt.tag` and whose
    version is a positive integer no newer than `fmt.version`. `where` names it in messages;
    `hint(data)` may add a clause to the wrong-format message (what the file looks like)."""
    data = parse_json(text, where)
    if not isinstance(data, dict) or data.get("format") != fmt.tag:
        found = data.get("format") if isinstance(data, dict) else None
        said = (f"its \"format\" is {found!r}" if found is not None
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
                  hint: Callable[[Any], str] | None = None) -> dict[str, Any]:
    """The document at `path` (see `parse_document`); `missing` is the message when the file
    does not exist, which should say how to make it."""
    return parse_document(read_text(path, missing, fmt.title), fmt, str(path), hint)
