"""The layout of a GGUF file, read directly: header, metadata, tensor descriptions, data offset.

    magic b"GGUF" | version u32 | tensor count u64 | metadata count u64
    metadata:  key (string) | value type u32 | value                (count times)
    tensors:   name (string) | n_dims u32 | dims u64 x n_dims | type u32 | offset u64
    padding to `general.alignment` (default 32), then the tensor data, each at its offset

llama.cpp's reader (ggml/src/gguf.cpp) holds a file to more than this, and so does sheepop's:
`general.alignment` is a uint32 and a power of two, and each tensor's data starts at a multiple
of it and overlaps no other tensor's (llama.cpp even wants them in order, without gaps; the
format's description asks only for aligned offsets). A file that breaks them is refused, naming
the field or the tensors, before anything is read from the data.

A string is a u64 byte length and UTF-8 bytes; an array is an element type u32, a u64 count and
the elements; every number is little-endian. The `gguf` package's reader gives the same values,
but builds a memory-mapped view for every element of every field: SmolLM2's 49,152 tokens and
48,900 merges took it 7-19 s, where one pass of `struct.unpack_from` over the bytes takes
a fraction of a second. The tensor data stays memory-mapped, read when a tensor is asked for.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

# GGUF's value types: 0-7 and 10-12 fixed-size numbers (struct codes), 8 string, 9 array.
_NUMBERS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
            12: "d"}
STRING, ARRAY = 8, 9
DEFAULT_ALIGNMENT = 32
MAX_NESTING = 8  # arrays of arrays: llama.cpp writes none deeper than 2


class LayoutError(ValueError):
    """The bytes do not follow GGUF's layout (truncated or corrupt)."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dims: tuple[int, ...]  # GGUF's order: fastest-varying first (a row's length is dims[0])
    type: int              # a ggml type number (gguf.GGMLQuantizationType)
    offset: int            # from the start of the data section


class _Cursor:
    """Reads little-endian values from `buf` onwards from `pos`, refusing to run past its end."""

    def __init__(self, buf: Any, pos: int = 0):
        self.buf, self.pos, self.end = buf, pos, len(buf)

    def number(self, code: str) -> Any:
        size = struct.calcsize(code)
        if self.pos + size > self.end:
            raise LayoutError(f"the file ends inside a value at byte {self.pos}")
        (value,) = struct.unpack_from("<" + code, self.buf, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        n = self.number("Q")
        if self.pos + n > self.end:
            raise LayoutError(f"a string of {n} bytes at byte {self.pos} runs past the end")
        text = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8")
        self.pos += n
        return text

    def value(self, kind: int, depth: int = 0) -> Any:
        if depth > MAX_NESTING:  # (a hostile file must not reach Python's recursion limit)
            raise LayoutError(f"arrays nested more than {MAX_NESTING} deep at byte {self.pos}")
        if kind in _NUMBERS:
            return self.number(_NUMBERS[kind])
        if kind == STRING:
            return self.string()
        if kind == ARRAY:
            item, count = self.number("I"), self.number("Q")
            if item in _NUMBERS:  # one unpack for the whole array of numbers
                code = _NUMBERS[item]
                size = struct.calcsize(code) * count
                if self.pos + size > self.end:
                    raise LayoutError(f"an array of {count} numbers runs past the end")
                values = list(struct.unpack_from(f"<{count}{code}", self.buf, self.pos))
                self.pos += size
                return values
            return [self.value(item, depth + 1) for _ in range(count)]
        raise LayoutError(f"unknown metadata value type {kind} at byte {self.pos}")


def read_layout(buf: Any) -> tuple[int, dict[str, Any], list[TensorInfo], int]:
    """(version, metadata, tensor descriptions, byte offset of the data section) of the GGUF
    bytes `buf` (a memory map). LayoutError when they do not follow the layout."""
    c = _Cursor(buf)
    if bytes(buf[:4]) != b"GGUF":
        raise LayoutError("no GGUF magic")
    c.pos = 4
    version = c.number("I")
    if version not in (2, 3):
        raise LayoutError(f"GGUF version {version} (sheepop reads versions 2 and 3)")
    n_tensors, n_meta = c.number("Q"), c.number("Q")
    meta: dict[str, Any] = {}
    alignment = DEFAULT_ALIGNMENT
    for _ in range(n_meta):
        key = c.string()
        kind = c.number("I")
        meta[key] = c.value(kind)
        if key == "general.alignment":
            alignment = _alignment(kind, meta[key])
    tensors = []
    for _ in range(n_tensors):
        name = c.string()
        n_dims = c.number("I")
        if n_dims > 8:
            raise LayoutError(f"tensor {name} has {n_dims} dimensions")
        dims = tuple(c.number("Q") for _ in range(n_dims))
        tensors.append(TensorInfo(name, dims, c.number("I"), c.number("Q")))
    _check_offsets(tensors, alignment)
    data_start = -(-c.pos // alignment) * alignment
    return version, meta, tensors, data_start


def _alignment(kind: int, value: Any) -> int:
    """general.alignment, which must be a uint32 power of two (as llama.cpp reads it)."""
    if kind != 4:
        raise LayoutError(f"general.alignment is not a uint32 ({str(value)[:40]!r})")
    if value == 0 or value & (value - 1):
        raise LayoutError(f"general.alignment is {value}, not a power of two")
    return value


def row_layout(info: TensorInfo) -> tuple[int, int] | None:
    """(number of rows, bytes a row) of the tensor's data; None for a type number ggml does not
    know. LayoutError when its rows are not whole blocks of its type."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    try:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(info.type)]
    except ValueError:
        return None
    row = info.dims[0] if info.dims else 1
    if row % block:
        raise LayoutError(f"tensor {info.name}: a row of {row} values is not whole blocks of "
                          f"{block}")
    return int(np.prod(info.dims[1:], dtype=object)), row // block * size  # (no overflow)


def _check_offsets(tensors: list[TensorInfo], alignment: int) -> None:
    """Each tensor's data at a multiple of the alignment, no two overlapping."""
    spans = []
    for t in tensors:
        if t.offset % alignment:
            raise LayoutError(f"tensor {t.name}'s data offset {t.offset} is not a multiple of "
                              f"general.alignment ({alignment})")
        rows = row_layout(t)  # (an unknown type is refused by name later)
        if rows and rows[0] * rows[1]:  # (an empty tensor holds no bytes)
            spans.append((t.offset, t.offset + rows[0] * rows[1], t.name))
    spans.sort()
    for (_, end, before), (start, _, name) in zip(spans, spans[1:]):
        if start < end:
            raise LayoutError(f"tensor {name}'s data (from offset {start}) overlaps tensor "
                              f"{before}'s (which ends at {end})")


def tensor_bytes(buf: np.ndarray, info: TensorInfo, data_start: int) -> np.ndarray:
    """The tensor's stored values in NumPy order (its dims reversed): for float types an array
    of that dtype, for a quantized type uint8 rows of blocks (what gguf.quants.dequantize
    takes). LayoutError when the tensor runs past the end of the file."""
    from gguf import GGMLQuantizationType

    kind = GGMLQuantizationType(info.type)
    shape = tuple(reversed(info.dims)) or (1,)
    n_rows, row_bytes = row_layout(info)  # type: ignore[misc]  # (a type ggml knows)
    start = data_start + info.offset
    end = start + n_rows * row_bytes
    if end > len(buf):
        raise LayoutError(f"tensor {info.name} runs past the end of the file")
    raw = buf[start:end]
    floats = {GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16,
              GGMLQuantizationType.F64: np.float64}
    if kind in floats:
        return raw.view(floats[kind]).reshape(shape)
    return raw.reshape(*shape[:-1], row_bytes)  # (BF16 too: dequantize widens its bytes)
