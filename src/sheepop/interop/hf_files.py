"""The files of a Hugging Face model directory that do not depend on the architecture.

A Hugging Face directory holds `config.json`, `model.safetensors` (or shards listed in
`model.safetensors.index.json`) and the tokenizer: `tokenizer.json` (the `tokenizers` format)
and/or GPT-2's `vocab.json` + `merges.txt`. This module reads and writes the weights files and
the tokenizer (sheepop's byte-level BPE, or a pretrained model's own tokenizer.json read
exactly: sheepop.tokenizers.pretrained) for every architecture `sheepop.interop.hf` converts.
Only safetensors weights are read: a `pytorch_model.bin` is a pickle, which could run code.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from sheepop.arch.quantize import bf16_values
from sheepop.checkpoint.check import (
    DTYPES,
    MAX_HEADER_BYTES,
    TensorEntry,
    check_dtypes,
    parse_header,
)
from sheepop.checkpoint.tensor_file import safetensors_bytes
from sheepop.errors import UserError
from sheepop.files import (
    atomic_write_bytes,
    atomic_write_text,
    open_regular,
    read_json,
    shown,
)

WEIGHTS = "model.safetensors"
# Buffers that transformers recomputes, stored by older checkpoints: skipped unread.
BUFFERS = ("rotary_emb.inv_freq", ".attn.bias", ".attn.masked_bias")
INDEX = "model.safetensors.index.json"


def write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """A safetensors file as transformers and PEFT read it (they insist on its "format"
    metadata); each tensor row-major, whatever its order in memory (the decode layout)."""
    atomic_write_bytes(path, safetensors_bytes(tensors, metadata={"format": "pt"}))


def write_weights(out_dir: Path, weights: dict[str, np.ndarray]) -> None:
    write_safetensors(out_dir / WEIGHTS, weights)


def read_hf_config(hf_dir: Path) -> dict[str, Any]:
    hf = read_json(hf_dir / "config.json", what="config.json")
    if not isinstance(hf, dict):
        raise UserError(f"{hf_dir / 'config.json'} is not a JSON object")
    return hf


# ----- weights --------------------------------------------------------------------------------

def weight_files(hf_dir: Path) -> list[Path]:
    """The safetensors files holding the weights (refusing pickles before anything is read, and
    an index naming a file outside the directory)."""
    if (hf_dir / WEIGHTS).exists():
        return [hf_dir / WEIGHTS]
    if (hf_dir / INDEX).exists():
        where = hf_dir / INDEX
        index = read_json(where, what=INDEX)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise UserError(f"{where}: weight_map is not an object of tensor name -> file name")
        names = set()
        for name in weight_map.values():
            if not isinstance(name, str) or not name:
                raise UserError(f"{where}: weight_map names the file {shown(name)}, not a file "
                                "name")
            names.add(name)
        inside = hf_dir.resolve()
        for name in names:
            if not (hf_dir / name).resolve().is_relative_to(inside):
                raise UserError(f"{where}: weight_map names {shown(name)}, which is outside "
                                f"{hf_dir}: sheepop reads weights only from the model's own "
                                "directory")
        return [hf_dir / name for name in sorted(names)]
    if any(hf_dir.glob("*.bin")) or any(hf_dir.glob("*.pt")):
        raise UserError(f"{hf_dir} has only pickle weights (.bin/.pt), which sheepop does not "
                        "load because unpickling can run code: save them as safetensors first "
                        "(model.save_pretrained(dir, safe_serialization=True))")
    raise UserError(f"{hf_dir} has no {WEIGHTS}")


def _header(f: Any, path: Path) -> tuple[int, dict[str, TensorEntry]]:
    """(where the data part starts, the tensors) of an open safetensors file, checked against
    its size (sheepop.checkpoint.check.parse_header) before a tensor is read."""
    size = os.fstat(f.fileno()).st_size
    first = f.read(8)
    n = int.from_bytes(first, "little") if len(first) == 8 else -1
    if n < 0 or n > min(MAX_HEADER_BYTES, size - 8):
        raise UserError(f"{path} is not a valid safetensors file (its header does not fit in "
                        f"its {size:,} bytes)")
    return 8 + n, parse_header(f.read(n), size - 8 - n, str(path))


def _float32(raw: bytes, entry: TensorEntry) -> np.ndarray:
    """One tensor's little-endian bytes as float32 (bfloat16 is the top half of a float32)."""
    values = np.frombuffer(raw, dtype=DTYPES[entry.dtype][1])
    if entry.dtype == "BF16":
        return bf16_values(values).reshape(entry.shape)
    with np.errstate(over="ignore"):  # a float64 past float32's range: inf, refused below
        return values.astype(np.float32).reshape(entry.shape)


def read_weights(files: list[Path], max_values: int | None = None) -> dict[str, np.ndarray]:
    """Every tensor of the files as float32 NumPy. Before a tensor is read, each file's header
    is checked against its size, a tensor that is not floating point (integers would be cast
    silently) is refused by name, and so are more than `max_values` numbers in all (the model
    the config describes, so a huge or padded file is refused unread); buffers transformers
    recomputes (`BUFFERS`) are skipped unread. A NaN or infinite weight is refused by name: the
    model would print garbage."""
    located: list[tuple[Path, int, str, TensorEntry]] = []
    for path in files:
        with open_regular(path, what="weight file") as f:
            start, entries = _header(f, path)
        entries = {name: e for name, e in entries.items() if not name.endswith(BUFFERS)}
        check_dtypes(entries, str(path))
        located += [(path, start, name, e) for name, e in entries.items()]
    total = sum(math.prod(e.shape) for *_, e in located)
    if max_values is not None and total > max_values:
        raise UserError(f"the weight files hold {total:,} numbers, more than the {max_values:,} "
                        "parameters config.json describes: not this model's weights")
    state: dict[str, np.ndarray] = {}
    for path in files:
        with open_regular(path, what="weight file") as f:
            for _, start, name, entry in (t for t in located if t[0] == path):
                f.seek(start + entry.begin)
                raw = f.read(entry.end - entry.begin)
                if len(raw) != entry.end - entry.begin:
                    raise UserError(f"{path}: tensor {shown(name)} is cut short (the file "
                                    "changed while it was read)")
                array = _float32(raw, entry)
                bad = array.size - int(np.isfinite(array).sum())
                if bad:
                    raise UserError(f"{path}: tensor {shown(name)} holds {bad:,} NaN or "
                                    f"infinite values (of {array.size:,}): these weights "
                                    "cannot run")
                state[name] = array
    return state
