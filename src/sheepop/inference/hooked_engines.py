"""One forward pass, or one forward and one backward pass, of either engine through its hook
points (docs/hooks.md): what the experiments that change a point and read what follows stand on
(sheepop.inference.patching, .attribution, .logit_attribution; docs/experiments.md).

    engine.last_logits(ids, hooks)      z, the logits at the prompt's last position (V,), float64
    engine.values(ids, points)          (z, each point's value as a NumPy array of its own)
    engine.gradients(ids, points, w)    (z, values, d(sum_t w_t z_t)/d(point) at each point)
    engine.edited(value, edit)          a copy of a point's value, `edit` applied to it as a
                                        NumPy array, in the engine's own type: what a hook that
                                        replaces a point returns

The torch engine's gradients are autograd's through the hooked points; the NumPy engine's its
hand-written backward read at the same points (sheepop.scratch.gpt.gpt_backward's
`gradients`). Both run without a KV cache, one prompt (a batch of one), in the model's dtype.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from sheepop.arch.hooks import Hook
from sheepop.config.schema import ModelConfig
from sheepop.errors import UserError
from sheepop.inference.load import InferenceModel
from sheepop.inference.weights import model_weights

Values = dict[str, np.ndarray]
Edit = Callable[[np.ndarray], None]
"""Changes a point's value (a NumPy copy of it) in place."""


class HookedEngine(Protocol):
    cfg: ModelConfig
    weights: Mapping[str, np.ndarray]

    def last_logits(self, ids: Sequence[int], hooks: Mapping[str, Hook]) -> np.ndarray: ...

    def values(self, ids: Sequence[int], points: Sequence[str]) -> tuple[np.ndarray, Values]: ...

    def gradients(self, ids: Sequence[int], points: Sequence[str], weights: Mapping[int, float]
                  ) -> tuple[np.ndarray, Values, Values]: ...

    def edited(self, value: Any, edit: Edit) -> Any: ...


class NoGradients(UserError):
    """The engine cannot differentiate this model (torch's int8 and int4 kernels have no
    backward)."""


def _numpy(value: Any) -> np.ndarray:
    """A point's value as a NumPy array of its own: a torch tensor's in float32 when NumPy has
    no such type (bfloat16: every bfloat16 is a float32, exactly)."""
    if not hasattr(value, "detach"):
        return value.copy()
    t = value.detach().cpu()
    try:
        return t.numpy().copy()
    except TypeError:  # (torch: "Got unsupported ScalarType BFloat16")
        return t.float().numpy()


def _keeper(kept: Values) -> Hook:
    """An observer that keeps a NumPy copy of each point it sees."""
    def keep(value: Any, point: str) -> None:
        kept[point] = _numpy(value)
    return keep


class _ReadsValues:
    """`values` from the engine's own `last_logits`: one pass observing the points."""

    def values(self, ids: Sequence[int], points: Sequence[str]) -> tuple[np.ndarray, Values]:
        kept: Values = {}
        keep = _keeper(kept)
        return self.last_logits(ids, {p: keep for p in points}), kept


class NumpyHooked(_ReadsValues):
    """The NumPy engine on `params` (any float dtype: float64 for a finite-difference check)."""

    def __init__(self, params: Mapping[str, np.ndarray], cfg: ModelConfig):
        self.weights, self.cfg = params, cfg

    def _forward(self, ids: Sequence[int], hooks: Mapping[str, Hook], last_only: bool):
        from sheepop.scratch.gpt import gpt_forward
        from sheepop.scratch.hooks import hooked
        with hooked(self.cfg, hooks):
            return gpt_forward(dict(self.weights), self.cfg, np.asarray([list(ids)]),
                               last_only=last_only)

    def last_logits(self, ids: Sequence[int], hooks: Mapping[str, Hook]) -> np.ndarray:
        return self._forward(ids, hooks, True)[0][0, -1].astype(np.float64)

    def gradients(self, ids: Sequence[int], points: Sequence[str], weights: Mapping[int, float]
                  ) -> tuple[np.ndarray, Values, Values]:
        from sheepop.scratch.gpt import gpt_backward
        kept: Values = {}
        grads: Values = {}
        logits, _, cache = self._forward(ids, {p: _keeper(kept) for p in points}, False)
        dlogits = np.zeros_like(logits)
        for token, w in weights.items():
            dlogits[0, -1, token] += w
        gpt_backward(cache, dlogits=dlogits, gradients={p: _keeper(grads) for p in points})
        return logits[0, -1].astype(np.float64), kept, grads

    def edited(self, value: np.ndarray, edit: Edit) -> np.ndarray:
        out = value.copy()
        edit(out)
        return out


class TorchHooked(_ReadsValues):
    """The torch engine's `model` (a sheepop.model.GPT, in eval mode, on any device and dtype)."""

    def __init__(self, model: Any):
        self.model, self.cfg = model, model.cfg
        self.weights = model.numpy_weights()
        self.quantized = any(hasattr(m, "dequantized") for m in model.modules())
        """Weights in int8 or int4 (sheepop.model.quantized*): torch has no backward there."""

    def _idx(self, ids: Sequence[int]):
        import torch
        return torch.tensor([list(ids)], dtype=torch.long, device=self.model.tok_emb.weight.device)

    def last_logits(self, ids: Sequence[int], hooks: Mapping[str, Hook]) -> np.ndarray:
        import torch

        from sheepop.model.hooks import hooked
        with torch.no_grad(), hooked(self.model, hooks):
            logits, _ = self.model(self._idx(ids), last_only=True)
        return logits[0, -1].double().cpu().numpy()

    def gradients(self, ids: Sequence[int], points: Sequence[str], weights: Mapping[int, float]
                  ) -> tuple[np.ndarray, Values, Values]:
        import torch

        from sheepop.model.hooks import hooked
        if self.quantized:
            raise NoGradients("attribution patching needs the gradient through the weights' "
                              "products, and torch's int8 and int4 kernels have none: serve "
                              "the model in float32 or bfloat16, or patch exactly alone")
        live: dict[str, Any] = {}

        def keep(x, point):
            live[point] = x

        def leaf(x, point):  # the same numbers, made a leaf that needs a gradient: every point
            x = x.detach().requires_grad_(True)  # after it is then in autograd's graph
            if "embed" in points:
                live[point] = x
            return x

        hooks: dict[str, Hook] = {p: keep for p in points}
        hooks["embed"] = leaf
        with torch.enable_grad(), hooked(self.model, hooks):
            logits, _ = self.model(self._idx(ids), last_only=True)
            z = logits[0, -1]
            metric = sum(w * z[token] for token, w in weights.items())
            grads = torch.autograd.grad(metric, [live[p] for p in points])
        kept = {p: _numpy(live[p]) for p in points}
        return (z.detach().double().cpu().numpy(), kept,
                {p: _numpy(g) for p, g in zip(points, grads)})

    def edited(self, value: Any, edit: Edit) -> Any:
        import torch
        out = _numpy(value)
        edit(out)
        return torch.from_numpy(out).to(device=value.device, dtype=value.dtype)


def hooked_engine(model: InferenceModel) -> HookedEngine:
    """The engine of a model built for inference (sheepop.inference.load), through its hooks."""
    if model.engine == "numpy":
        return NumpyHooked(model_weights(model), model.config.model)
    return TorchHooked(model.lm.model)
