"""Reading a GGUF file: its metadata as Python values, its tensors as float32 NumPy arrays.

GGUF (llama.cpp's format) is: the magic b"GGUF", a version, key/value metadata ("llama.block_count"
-> 30), tensor descriptions (name, type, dims, offset), then the aligned tensor data. A tensor's
dims are listed fastest-varying first (ggml's ne[0] is the length of a row), the reverse of NumPy's
order: a torch `nn.Linear` weight of shape (out, in) is stored with dims [in, out]. The layout is
read by sheepop.interop.gguf_layout, which memory-maps the file and gives each tensor in NumPy
order ((out, in) here), quantized types as rows of bytes; `gguf.quants.dequantize` turns those
into float32 rows of the same NumPy shape.

Quantized types store blocks of 32 (or 256, the "K" types) weights as small integers with a scale
(and for some a minimum) per block: Q8_0 w = d * q (q an int8); Q4_0 w = d * (q - 8) (q 4 bits);
Q4_1 w = d * q + m; Q5_0 / Q5_1 the same with 5 bits; Q4_K, Q5_K: w = d * s_j * q - dmin * m_j
with 6-bit scales s_j and minimums m_j per 32 weights of a 256-weight block; Q6_K: w = d * s_j * (q
- 32) with 8-bit scales per 16 weights. `SUPPORTED_TYPES` are those sheepop reads (each tested
against a reference, tests/interop/test_gguf_tensors.py); any other is refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sheepop.errors import UserError
from sheepop.files import open_regular
from sheepop.interop.gguf_layout import LayoutError, TensorInfo, read_layout, tensor_bytes

MAGIC = b"GGUF"


def _supported() -> frozenset[Any]:
    from gguf import GGMLQuantizationType as Q
    return frozenset({Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q4_K,
                      Q.Q5_K, Q.Q6_K})


SUPPORTED_TYPE_NAMES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K",
                        "Q5_K", "Q6_K")


def is_gguf(path: str | Path) -> bool:
    """Whether `path` is a regular file that starts with GGUF's magic (whatever its name)."""
    path = Path(path)
    if not path.is_file():
        return False
    with open_regular(path, what="GGUF file") as f:
        return f.read(4) == MAGIC


@dataclass
class GGUFFile:
    """An open GGUF file: `meta` (key -> Python value: str, int, float, bool or a list of them),
    its tensors' descriptions by name, and the memory map their data is read from."""
    path: Path
    meta: dict[str, Any]
    tensors: dict[str, TensorInfo]
    buf: np.ndarray
    data_start: int

    @property
    def where(self) -> str:
        return str(self.path)

    def shape(self, name: str) -> tuple[int, ...]:
        """The tensor's shape in NumPy (torch) order: its GGUF dims reversed."""
        return tuple(reversed(self.tensors[name].dims))

    def type_name(self, name: str) -> str:
        from gguf import GGMLQuantizationType
        number = self.tensors[name].type
        try:
            return GGMLQuantizationType(number).name
        except ValueError:
            return f"number {number}"

    def check_types(self) -> None:
        """Refuse, naming the first such tensor and its type, any type sheepop cannot read
        (before any tensor is dequantized)."""
        supported = _supported()
        for name, t in self.tensors.items():
            if t.type not in supported:
                raise UserError(f"{self.where}: tensor {name} has type {self.type_name(name)}, "
                                f"which sheepop does not read (it reads "
                                f"{', '.join(SUPPORTED_TYPE_NAMES)})")

    def array(self, name: str) -> np.ndarray:
        """Tensor `name` as a float32 array of its NumPy shape (dequantized)."""
        from gguf.quants import dequantize
        t = self.tensors[name]
        if t.type not in _supported():
            self.check_types()
        try:
            stored = tensor_bytes(self.buf, t, self.data_start)
        except LayoutError as e:
            raise UserError(f"{self.where}: not a readable GGUF file (truncated or corrupt: "
                            f"{e})") from None
        values = dequantize(np.asarray(stored), t.type)
        bad = values.size - int(np.isfinite(values).sum())
        if bad:  # refused at import, as a run's own weights are: the model would print garbage
            raise UserError(f"{self.where}: tensor {name} holds {bad:,} NaN or infinite values "
                            f"(of {values.size:,}): these weights cannot run")
        return np.ascontiguousarray(values.reshape(self.shape(name)), dtype=np.float32)


def read_gguf(path: str | Path) -> GGUFFile:
    """Open a GGUF file (memory-mapped: tensors are read when asked for). A missing file, a file
    that is not GGUF or one that is truncated or corrupt is one UserError line."""
    path = Path(path)
    with open_regular(path, what="GGUF file") as f:
        head = f.read(4)
    if head != MAGIC:
        raise UserError(f"{path} is not a GGUF file (it does not start with b'GGUF')")
    buf = np.memmap(path, dtype=np.uint8, mode="r")
    try:
        _, meta, infos, data_start = read_layout(buf)
        tensors = {t.name: t for t in infos}
        for t in infos:  # every tensor inside the file, before anything is dequantized
            if t.type in _supported():
                tensor_bytes(buf, t, data_start)
    except (LayoutError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: not a readable GGUF file (truncated or corrupt: {e})") from None
    return GGUFFile(path, meta, tensors, buf, data_start)
