"""Which torch device a name means: `auto` is CUDA when present, else the CPU."""

from __future__ import annotations

import torch

from sheepop.errors import UserError


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"device {name} asked for, but CUDA is not available here")
    try:
        return torch.device(name)
    except RuntimeError:
        raise UserError(f"unknown device '{name}'") from None
