"""Hooks in the NumPy engine: the unit that sets them for a forward pass (docs/hooks.md).

    with hooked(cfg, {"blocks.0.attn.pattern": keep}):
        gpt_forward(params, cfg, idx)

The engine's layers are functions over weights and activations, so the hooks of the pass are
held per thread while `hooked` runs and each layer asks for them at its points
(sheepop.arch.hooks names them): `active()` for the model's points, `block()` for the block
running. Without hooks each asks once and finds None, a thread-local read per layer: the
decode step's cost is in docs/hooks.md. The block sets itself in `enter_block`, so the
attention and the feed-forward need no layer index to name their points.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import numpy as np

from sheepop.arch.hooks import Hook, Hooks, LayerHooks
from sheepop.config.schema import ModelConfig

_state = threading.local()


@contextmanager
def hooked(cfg: ModelConfig, hooks: Mapping[str, Hook]) -> Iterator[Hooks]:
    """The hooks `hooks` (point name -> hook) on every forward pass of this thread inside the
    block, and none after it (nor when it raises)."""
    if active() is not None:
        raise ValueError("this thread's passes are hooked already: one set of hooks at a time")
    _state.hooks, _state.block = Hooks(cfg, hooks), None
    try:
        yield _state.hooks
    finally:
        _state.hooks, _state.block = None, None


def active() -> Hooks | None:
    """The hooks of this thread's forward pass, None without any."""
    return getattr(_state, "hooks", None)


def enter_block(layer: int) -> LayerHooks | None:
    """Block `layer` starts: its hooks (None without any), which `block()` then gives."""
    hooks = getattr(_state, "hooks", None)
    if hooks is None:
        return None
    _state.block = hooks.blocks[layer]
    return _state.block


def block() -> LayerHooks | None:
    """The hooks of the block running, None without any."""
    return getattr(_state, "block", None)


def at_copy(hooks: LayerHooks, point: str, x: np.ndarray) -> np.ndarray:
    """Block point `point` after its hook, for an `x` the layer goes on to change in place (the
    scores, masked and turned into the pattern in their own buffer): the hook is handed a copy,
    so what it keeps stays the point's value."""
    seen = x.copy()
    out = hooks.at(point, seen)
    return x if out is seen else np.array(out, dtype=x.dtype)
