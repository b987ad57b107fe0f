"""Weights checked before they are read: a safetensors file's header against its own size, its
dtypes, and (given) the shapes a model config expects; then every tensor's values finite.

The safetensors layout (https://github.com/huggingface/safetensors):

    8 bytes      N, little-endian unsigned
    N bytes      JSON object: name -> {"dtype": "F32", "shape": [..], "data_offsets": [b, e]},
                 and an optional "__metadata__": {str: str}
    the rest     the tensors' bytes; tensor `name` is bytes [b, e) of this part, little-endian,
                 row-major, and e - b = prod(shape) x the dtype's size

`check_weights_file` reads only the header (opened through `files.open_regular`: regular files
only, so a FIFO or a symlink to /dev/zero is refused before a byte is read) and checks it
against the file's size, the dtypes and the shapes a config expects, so a file whose header lies
(a length past the end, offsets outside the file, a shape that does not fill its bytes, a tensor
the model lacks) costs nothing to refuse; `weights_from_bytes` makes the same checks on bytes
already read (`checkpoint.load_weights`), then converts and checks the values.

Dtypes: F32 is what sheepop writes; F16, BF16 and F64 are converted to float32 (an imported or
hand-made checkpoint may hold them, and the conversion only rounds); integers, booleans and
8-bit floats are refused, naming the tensor: such a file is not a model's weights. A tensor
holding NaN or an infinity is refused, naming it, because the model would print garbage.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sheepop.arch.params import check_shapes
from sheepop.arch.quantize import bf16_values
from sheepop.errors import UserError
from sheepop.files import open_regular, parse_json, shown

# A run's config.json is ~1.5 kB; 4 MiB leaves room for anything a later version adds.
MAX_CONFIG_BYTES = 4 * 2**20
# The safetensors reference implementation refuses headers past 100 MB; so does sheepop.
MAX_HEADER_BYTES = 100_000_000
# Dtype -> (bytes per element, NumPy little-endian type it is read as, or None: refused).
DTYPES: dict[str, tuple[int, str | None]] = {
    "F32": (4, "<f4"), "F64": (8, "<f8"), "F16": (2, "<f2"), "BF16": (2, "<u2"),
    "I64": (8, None), "I32": (4, None), "I16": (2, None), "I8": (1, None),
    "U64": (8, None), "U32": (4, None), "U16": (2, None), "U8": (1, None), "BOOL": (1, None),
    "F8_E4M3": (1, None), "F8_E5M2": (1, None),
}
FLOAT_DTYPES = ", ".join(name for name, (_, kind) in DTYPES.items() if kind is not None)


@dataclass(frozen=True)
class TensorEntry:
    """One tensor as the header describes it."""

    dtype: str
    shape: tuple[int, ...]
    begin: int  # offsets into the data part, [begin, end)
    end: int


def _is_count(x: object) -> bool:
    return type(x) is int and x >= 0


def parse_header(raw: bytes, data_size: int, where: str) -> dict[str, TensorEntry]:
    """The tensors of a header's JSON bytes, each checked against the `data_size` bytes that
    follow it; one UserError line naming the first tensor that is wrong."""
    header = parse_json(raw, f"{where} (safetensors header)")
    if not isinstance(header, dict):
        raise UserError(f"{where}: the safetensors header is not a JSON object")
    entries = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        tensor = f"{where}: tensor {shown(name)}"
        if not isinstance(entry, dict):
            raise UserError(f"{tensor} has no dtype, shape and data_offsets")
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if not isinstance(dtype, str) or dtype not in DTYPES:
            raise UserError(f"{tensor} has an unknown dtype {shown(dtype)}")
        if not isinstance(shape, list) or not all(_is_count(n) for n in shape):
            raise UserError(f"{tensor} has no valid shape ({shown(shape)})")
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(_is_count(n) for n in offsets) or offsets[0] > offsets[1]):
            raise UserError(f"{tensor} has no valid data_offsets ({shown(offsets)})")
        begin, end = offsets
        if end > data_size:
            raise UserError(f"{tensor} ends at byte {end:,} of the data, past the end of the "
                            f"file ({data_size:,} bytes of data): the file is truncated or "
                            "corrupt")
        if end - begin != math.prod(shape) * DTYPES[dtype][0]:
            raise UserError(f"{tensor}: its shape {tuple(shape)} of {dtype} does not fill its "
                            f"{end - begin:,} bytes")
        entries[name] = TensorEntry(dtype, tuple(shape), begin, end)
    covered = max((e.end for e in entries.values()), default=0)
    if covered != data_size:  # as the safetensors library refuses a file not fully covered
        raise UserError(f"{where} is not a valid safetensors file ({data_size - covered:,} "
                        "bytes after its last tensor)")
    return entries


def _header_length(first: bytes, size: int, where: str) -> int:
    """N, from the first 8 bytes of a safetensors file of `size` bytes, checked."""
    if size < 8:
        raise UserError(f"{where} is not a valid safetensors file (only {size} bytes)")
    n = int.from_bytes(first[:8], "little")
    if n > min(MAX_HEADER_BYTES, size - 8):
        raise UserError(f"{where} is not a valid safetensors file (its header claims {n:,} "
                        f"bytes; the file has {size:,})")
    return n


def safetensors_metadata(data: bytes, where: str) -> dict[str, str]:
    """The "__metadata__" object of a safetensors file's bytes ({} without one), after the
    header's checks; one UserError line when it is not {str: str}."""
    n = _header_length(data[:8], len(data), where)
    parse_header(data[8:8 + n], len(data) - 8 - n, where)
    meta = parse_json(data[8:8 + n], f"{where} (safetensors header)").get("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise UserError(f"{where}: the safetensors metadata is not an object of strings")
    return meta


def check_expected(entries: dict[str, TensorEntry], expected: dict[str, tuple[int, ...]],
                   where: str) -> None:
    """The header names exactly the `expected` tensors, each of its shape."""
    check_shapes({name: e.shape for name, e in entries.items()}, expected, where)


def check_dtypes(entries: dict[str, TensorEntry], where: str) -> None:
    for name, entry in entries.items():
        if DTYPES[entry.dtype][1] is None:
            raise UserError(f"{where}: tensor {shown(name)} is {entry.dtype}; weights must be "
                            f"floating point ({FLOAT_DTYPES})")


def check_weights_file(path: str | Path, expected: dict[str, tuple[int, ...]] | None = None,
                       what: str = "weights") -> None:
    """Check a weights file's header (size, dtypes, `expected` names and shapes) without
    reading its tensors."""
    with open_regular(path, f"checkpoint is missing {Path(path).name} (looked for {path})",
                      what) as f:
        size = os.fstat(f.fileno()).st_size
        n = _header_length(f.read(8), size, str(path))
        entries = parse_header(f.read(n), size - 8 - n, str(path))
    check_dtypes(entries, str(path))
    if expected is not None:
        check_expected(entries, expected, str(path))


def _as_float32(data: bytes, offset: int, entry: TensorEntry) -> np.ndarray:
    """A tensor's bytes as a new float32 array (a copy: the engines may update it in place)."""
    kind = DTYPES[entry.dtype][1]
    raw = np.frombuffer(data, dtype=kind, count=math.prod(entry.shape),
                        offset=offset + entry.begin)
    if entry.dtype == "BF16":
        return bf16_values(raw).reshape(entry.shape)
    with np.errstate(over="ignore"):  # an F64 past float32's range becomes inf: refused below
        return raw.astype(np.float32).reshape(entry.shape)


def weights_from_bytes(data: bytes, where: str | Path,
                       expected: dict[str, tuple[int, ...]] | None = None
                       ) -> dict[str, np.ndarray]:
    """The float32 tensors of a safetensors file's bytes, after every check above (`expected`:
    the names and shapes a model config wants); one UserError line naming the file and the
    tensor otherwise."""
    where = str(where)
    n = _header_length(data[:8], len(data), where)
    entries = parse_header(data[8:8 + n], len(data) - 8 - n, where)
    check_dtypes(entries, where)
    if expected is not None:
        check_expected(entries, expected, where)
    weights = {}
    for name, entry in entries.items():
        array = _as_float32(data, 8 + n, entry)
        finite = np.isfinite(array)
        if not finite.all():
            raise UserError(f"{where}: tensor {shown(name)} holds {array.size - finite.sum():,} "
                            f"NaN or infinite values (of {array.size:,}): these weights "
                            "cannot run")
        weights[name] = array
    return weights
