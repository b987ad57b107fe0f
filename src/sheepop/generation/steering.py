"""Steering: a vector added to the residual stream out of one block, at every position
(docs/steering.md), as llama.cpp's control vectors are.

A steering vector v at layer l is the difference of the mean residuals h_(l+1) = the point
`blocks.l.resid_out` (sheepop.arch.hooks) of two sets of prompts (sheepop.inference.steer makes
it). Steered with strength s, every forward pass computes

    h_(l+1) <- h_(l+1) + s v        at every position, prompt and generated alike

so block l + 1 and every later one read the moved stream, and so do the keys and values the
KV cache keeps: a cached decode step reads the steered past as a full recomputation would.
Several vectors add up (their s v summed per layer). Strength 0 adds zeros: the same bits as no
steering.

The file: safetensors (no pickle) with one float32 tensor "vector" (d,) and, in its metadata
under "sheepop", a versioned JSON document (sheepop.files.DocumentFormat) naming the layer, the
point, the model it was computed on (its name, width and depth) and how (positions, prompts). A
vector of another width is refused naming both models; a layer past the model's last too.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sheepop.checkpoint.check import safetensors_metadata, weights_from_bytes
from sheepop.checkpoint.tensor_file import safetensors_bytes
from sheepop.config.schema import ModelConfig
from sheepop.errors import UserError
from sheepop.files import (
    DocumentFormat,
    atomic_write_bytes,
    document_text,
    parse_document,
    read_bytes,
)

STEERING = DocumentFormat("sheepop-steering", 1, "sheepop steering vector")
MAX_STEERING_BYTES = 64 * 2**20  # a vector of width 16M, far past any model sheepop runs
POSITIONS = ("mean", "last")
"""Which positions of a prompt a residual is read at: the mean over every position but the
first (the first is the attention sink: its residual's norm in SmolLM2's middle layers is ~100x
the others'), or the last position alone."""


def point_of(layer: int) -> str:
    """The hook point a vector at `layer` is added to: the residual stream out of block
    `layer`."""
    return f"blocks.{layer}.resid_out"


@dataclass(frozen=True)
class SteeringVector:
    """v (d,) float32 at block `layer`'s output, computed on model `model` (its name) of
    `n_layer` blocks, from `positive` and `negative` prompts read at `positions`."""

    vector: np.ndarray
    layer: int
    model: str
    n_layer: int
    positions: str = "mean"
    positive: int = 0
    negative: int = 0

    @property
    def width(self) -> int:
        return int(self.vector.shape[0])

    @property
    def point(self) -> str:
        return point_of(self.layer)

    def describe(self) -> str:
        return f"width {self.width}, layer {self.layer}, made on model {self.model!r}"

    def check_fits(self, cfg: ModelConfig, model: str, where: str) -> None:
        """One UserError line unless this vector can steer the model `cfg` (named `model`)."""
        if self.width != cfg.n_embd:
            raise UserError(f"{where}: a steering vector of width {self.width} (made on model "
                            f"{self.model!r}) cannot steer model {model!r} of width "
                            f"{cfg.n_embd}")
        if self.layer >= cfg.n_layer:
            raise UserError(f"{where}: a steering vector at layer {self.layer} (made on model "
                            f"{self.model!r}) cannot steer model {model!r} of "
                            f"{cfg.n_layer} layers (0 to {cfg.n_layer - 1})")

    def save(self, path: str | Path) -> None:
        """Write the vector to `path` (safetensors, atomically)."""
        body = {"point": self.point, "layer": self.layer, "model": self.model,
                "width": self.width, "n_layer": self.n_layer, "positions": self.positions,
                "positive_prompts": self.positive, "negative_prompts": self.negative}
        meta = {"sheepop": document_text(STEERING, body, indent=0)}
        vector = np.asarray(self.vector, dtype=np.float32)
        atomic_write_bytes(path, safetensors_bytes({"vector": vector}, meta))


def read_vector(path: str | Path) -> SteeringVector:
    """The steering vector saved at `path`; one UserError line naming the file when it is not
    one (not safetensors, no document, another format, a wrong field, values not finite)."""
    where = str(path)
    data = read_bytes(path, f"steering vector not found: {path}", "steering vector",
                      MAX_STEERING_BYTES)
    meta = safetensors_metadata(data, where).get("sheepop")
    if meta is None:
        raise UserError(f"{where} is not a sheepop steering vector (no 'sheepop' metadata; "
                        "make one with `sheepop steer make`)")
    doc = parse_document(meta, STEERING, where)
    tensors = weights_from_bytes(data, where)
    vector = tensors.get("vector")
    if vector is None or vector.ndim != 1 or set(tensors) != {"vector"}:
        raise UserError(f"{where}: a steering vector holds one tensor 'vector' of shape (d,)")
    layer, width = doc.get("layer"), doc.get("width")
    if type(layer) is not int or layer < 0 or doc.get("point") != point_of(layer):
        raise UserError(f"{where}: the layer ({layer!r}) and the point ({doc.get('point')!r}) "
                        "do not name a block's output")
    if width != vector.shape[0]:
        raise UserError(f"{where}: its width ({width!r}) is not its vector's ({vector.shape[0]})")
    return SteeringVector(vector, layer, str(doc.get("model", "")), int(doc.get("n_layer", 0)),
                          str(doc.get("positions", "")), int(doc.get("positive_prompts", 0)),
                          int(doc.get("negative_prompts", 0)))


@dataclass(frozen=True)
class Steering:
    """Vectors, each with its strength: what one generation (or one request's rows) adds."""

    terms: tuple[tuple[SteeringVector, float], ...]

    def __post_init__(self) -> None:
        for _, strength in self.terms:
            if not math.isfinite(strength):
                raise ValueError(f"a steering strength must be finite, not {strength}")

    def additions(self) -> dict[int, np.ndarray]:
        """Layer -> sum of s v over the vectors at that layer, (d,) float32 (summed in
        float64, rounded once)."""
        out: dict[int, np.ndarray] = {}
        for vector, strength in self.terms:
            out[vector.layer] = out.get(vector.layer, 0.0) + strength * vector.vector.astype(
                np.float64)
        return {layer: np.asarray(a, dtype=np.float32) for layer, a in out.items()}

    def describe(self) -> str:
        return "; ".join(f"strength {s:g} at layer {v.layer} ({v.model!r})"
                         for v, s in self.terms)


def row_additions(rows: Sequence[Steering | None]) -> dict[int, np.ndarray]:
    """Layer -> (B, 1, d) float32: each row's own sum of s v (zeros for a row not steered at
    that layer); {} when no row is steered. What a batch of requests, each steered its own
    way, adds in one pass (the server's rows)."""
    per_row = [{} if r is None else r.additions() for r in rows]
    layers = sorted({layer for adds in per_row for layer in adds})
    out = {}
    for layer in layers:
        width = next(adds[layer].shape[0] for adds in per_row if layer in adds)
        a = np.zeros((len(rows), 1, width), dtype=np.float32)
        for b, adds in enumerate(per_row):
            if layer in adds:
                a[b, 0] = adds[layer]
        out[layer] = a
    return out


def parse_strengths(raw: Any, vectors: dict[str, SteeringVector], field: str) -> Steering | None:
    """A request's `field` value: an object {vector name: strength} over the `vectors` a server
    loaded, each strength a finite number in [-1000, 1000]; ValueError naming what is wrong
    (the server answers it as a 400 naming the field). {} or None: no steering."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ValueError(f"'{field}' must be an object {{vector name: strength}}, not "
                         f"{json.dumps(raw)[:60]}")
    terms = []
    for name, strength in raw.items():
        if name not in vectors:
            known = ", ".join(sorted(vectors)) or "none: start the server with --steer FILE"
            raise ValueError(f"'{field}' names no vector {name!r} (this server's: {known})")
        if type(strength) not in (int, float) or not math.isfinite(strength) or \
                abs(strength) > 1000:
            raise ValueError(f"'{field}.{name}' must be a number from -1000 to 1000, not "
                             f"{json.dumps(strength)[:60]}")
        terms.append((vectors[name], float(strength)))
    return Steering(tuple(terms)) if terms else None
