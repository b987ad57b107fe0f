"""Hooks in the torch engine: the unit that sets them for a forward pass (docs/hooks.md).

    with hooked(model, {"blocks.0.attn.pattern": keep}):
        model(idx)

`hooked` hands the model, each block, its attention and its feed-forward their share of the
hooks (sheepop.arch.hooks names the points) and takes them back after the block, so the layers'
signatures never carry them; without hooks each layer tests one attribute for None (the decode
step's cost is in docs/hooks.md). LoRA's and quantized layers sit below these modules and are
hooked as the plain ones are.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from sheepop.arch.hooks import Hook, Hooks
from sheepop.model.gpt import GPT


def _hooked_modules(model: GPT, hooks: Hooks | None) -> None:
    model.hooks = hooks
    for i, block in enumerate(model.blocks):
        share = None if hooks is None else hooks.blocks[i]
        block.hooks = block.attn.hooks = block.ffn.hooks = share


@contextmanager
def hooked(model: GPT, hooks: Mapping[str, Hook]) -> Iterator[Hooks]:
    """The hooks `hooks` (point name -> hook) on every forward pass of `model` inside the
    block, and none after it (nor when it raises)."""
    if model.hooks is not None:
        raise ValueError("the model is hooked already: one set of hooks at a time")
    chosen = Hooks(model.cfg, hooks)
    _hooked_modules(model, chosen)
    try:
        yield chosen
    finally:
        _hooked_modules(model, None)
