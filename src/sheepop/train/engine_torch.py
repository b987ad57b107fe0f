"""The torch engine's adapter for the training loop (see `sheepop.train.loop.Engine`).

One optimizer step on a list of micro-batches. Gradient accumulation is exact: with N the number
of counted (non-padding) targets over all micro-batches, each micro-batch contributes
(sum of its token losses) / N, so the accumulated gradient is the gradient of the large-batch
mean loss whatever the padding.

With LoRA (`lora`), the given weights are frozen and AdamW updates the adapters only
(sheepop.model.lora); `weights()` is then the adapters alone, what a LoRA checkpoint holds.
Weight decay follows the shared rule, so A and B (matrices) decay: that pulls the update s B A
toward zero, i.e. the model toward the base model, not the weights toward zero.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import numpy as np
import torch

from sheepop.arch import IGNORE_INDEX
from sheepop.arch.lora import LoraConfig
from sheepop.config.schema import ModelConfig, TrainConfig
from sheepop.errors import UserError
from sheepop.model import compiler
from sheepop.model.device import resolve_device
from sheepop.model.gpt import GPT, cross_entropy
from sheepop.model.logprob import token_logprobs
from sheepop.model.lora import adapter_weights, add_lora
from sheepop.model.lora import adapters_off as without_adapters
from sheepop.train.logprobs import LossOfLogprobs
from sheepop.train.optimizers import build_optimizers, set_lr

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        cuda_bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
        return torch.bfloat16 if cuda_bf16 else torch.float32
    if name == "float64":
        raise UserError("train.dtype=float64 is for the NumPy engine (--engine numpy); the "
                        "torch engine trains in float32, bfloat16 or float16")
    if name == "float16" and device.type != "cuda":
        raise UserError("train.dtype=float16 needs CUDA (it uses a gradient scaler); "
                        "on CPU use bfloat16 or float32")
    return DTYPES[name]


def native_bf16(device: torch.device) -> bool:
    """Whether bfloat16 products run at hardware speed: CUDA, or a CPU whose instructions oneDNN
    uses for bf16 (AVX-512 or AMX). Elsewhere a bf16 product is emulated, tens of times slower
    than float32 (docs/performance.md)."""
    if device.type == "cuda":
        return True
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


class TorchEngine:
    name = "torch"

    def __init__(self, model_cfg: ModelConfig, train_cfg: TrainConfig,
                 weights: dict[str, np.ndarray] | None = None, lora: LoraConfig | None = None,
                 adapters: dict[str, np.ndarray] | None = None):
        """`weights` (None: fresh ones by the config's seed); with `lora`, those weights are
        frozen and the adapters train, starting from `adapters` (None: fresh, B = 0)."""
        self.cfg = train_cfg
        self.lora = lora  # (threads: sheepop.threads, applied by train.start before the engine)
        self.device = resolve_device(train_cfg.device)
        self.dtype = resolve_dtype(train_cfg.dtype, self.device)
        torch.manual_seed(train_cfg.seed)
        self.model = GPT(model_cfg)
        if weights is not None:
            self.model.load_numpy_weights(weights)
        if lora is not None:
            add_lora(self.model, lora, adapters, seed=train_cfg.seed)
        self.model.to(self.device)
        self.param_names = {p: n for n, p in self.model.named_parameters()}
        # One fused kernel updates every parameter (CUDA, and CPU since torch 2.4) instead of a
        # dozen small operations per parameter: ~5% of a small model's CPU step
        # (benchmarks/vs_nanogpt.py, docs/performance.md).
        self.fused = self.device.type in ("cuda", "cpu")
        self.build_optimizers()
        self.scaler = torch.amp.GradScaler(self.device.type,
                                           enabled=self.dtype == torch.float16)
        self.forward = compiler.compile(self.model) if train_cfg.compile else self.model
        # Data-parallel training (sheepop.train.distributed) sets these: DDP's `no_sync` for all
        # micro-steps but the last, and world_size because DDP averages the ranks' gradients.
        self.no_sync = contextlib.nullcontext
        self.loss_multiplier = 1

    def build_optimizers(self) -> None:
        """`optimizers`: [AdamW] or [AdamW, Muon] (train.optimizer); `optimizer` is AdamW."""
        named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        self.optimizers = build_optimizers(named, self.cfg, self.fused,
                                           native_bf16(self.device))
        self.optimizer = self.optimizers[0]

    @property
    def description(self) -> str:
        text = f"torch on {self.device}, {str(self.dtype).replace('torch.', '')}"
        if self.dtype == torch.bfloat16 and not native_bf16(self.device):
            text += " (this CPU has no bf16 instructions: slower than float32 here)"
        return text

    def num_params(self) -> int:
        """Every parameter, adapters included."""
        return self.model.num_params()

    def trainable_params(self) -> int:
        """The parameters AdamW updates: all of them, or the adapters under LoRA."""
        return sum(p.numel() for p in self.model.parameters() if p.requires_grad)

    def _autocast(self):
        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def _tensor(self, a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64)).to(
            self.device, non_blocking=True)

    def micro_losses(self, micro_batches, total_count: int):
        """Forward and backward of each micro-batch; yields its summed token loss."""
        last = len(micro_batches) - 1
        for i, (x, y) in enumerate(micro_batches):
            with self.no_sync() if i < last else contextlib.nullcontext():
                with self._autocast():
                    logits, _ = self.forward(self._tensor(x))
                    loss_sum = cross_entropy(logits, self._tensor(y), reduction="sum")
                self.scaler.scale(loss_sum * self.loss_multiplier / total_count).backward()
            yield loss_sum.detach()

    def train_step(self, micro_batches: list[tuple[np.ndarray, np.ndarray]], lr: float,
                   total_count: int | None = None) -> tuple[float, float]:
        """One optimizer step; returns (mean loss over counted targets, gradient norm before
        clipping)."""
        self.model.train()
        set_lr(self.optimizers, lr, self.cfg)
        count = total_count or int(sum((y != IGNORE_INDEX).sum() for _, y in micro_batches))
        loss = sum(self.micro_losses(micro_batches, max(count, 1)))
        return float(loss) / max(count, 1), self._update()

    def _update(self) -> float:
        """Clip the accumulated gradients, step every optimizer, zero the gradients; the
        gradient norm before clipping."""
        for opt in self.optimizers:
            self.scaler.unscale_(opt)
        clip = self.cfg.grad_clip if self.cfg.grad_clip > 0 else math.inf
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        norm = torch.nn.utils.clip_grad_norm_(trainable, clip)
        for opt in self.optimizers:
            self.scaler.step(opt)
        self.scaler.update()
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)
        return float(norm)

    def token_logprobs(self, x: np.ndarray, y: np.ndarray, adapters_off: bool = False
                       ) -> np.ndarray:
        """log pi(y_t | x_<=t) (B, T) float64, 0 where y is IGNORE_INDEX; no dropout, no
        gradient. `adapters_off`: the base model's under LoRA (sheepop.model.lora.adapters_off),
        the reference that stays put while the adapters train."""
        self.model.eval()
        off = without_adapters(self.model) if adapters_off else contextlib.nullcontext()
        with torch.inference_mode(), self._autocast(), off:
            logits, _ = self.model(self._tensor(x))
            logp = token_logprobs(logits, self._tensor(y))
        return logp.double().cpu().numpy()

    def logprob_step(self, batches: list[tuple[np.ndarray, np.ndarray]], lr: float,
                     loss_of: LossOfLogprobs) -> tuple[float, float]:
        """One optimizer step on a loss of the per-token log-probabilities
        (sheepop.train.logprobs): for each batch, logp by the forward pass, (L_i, g) =
        loss_of(i, logp), then autograd's backward of sum g * logp (dL_i through the model).
        Returns (sum of the L_i, gradient norm before clipping)."""
        self.model.train()
        set_lr(self.optimizers, lr, self.cfg)
        total, last = 0.0, len(batches) - 1
        for i, (x, y) in enumerate(batches):
            with self.no_sync() if i < last else contextlib.nullcontext():
                with self._autocast():
                    logits, _ = self.forward(self._tensor(x))
                    logp = token_logprobs(logits, self._tensor(y))
                loss, dlogp = loss_of(i, logp.detach().double().cpu().numpy())
                g = torch.from_numpy(np.asarray(dlogp)).to(self.device, logp.dtype)
                self.scaler.scale((logp * g).sum() * self.loss_multiplier).backward()
            total += float(loss)
        return total, self._update()

    def eval_loss(self, x: np.ndarray, y: np.ndarray) -> tuple[float, int]:
        """(sum of token losses, number of counted targets) on one batch, no dropout."""
        self.model.eval()
        with torch.inference_mode(), self._autocast():
            logits, _ = self.forward(self._tensor(x))
            loss_sum = cross_entropy(logits, self._tensor(y), reduction="sum")
        return float(loss_sum), int((y != IGNORE_INDEX).sum())

    def weights(self) -> dict[str, np.ndarray]:
        """What a checkpoint saves: every weight, or the adapters alone under LoRA."""
        if self.lora is not None:
            return adapter_weights(self.model)
        return self.model.numpy_weights()

    # Optimizer state, keyed by parameter name so both engines read each other's.
    def optimizer_arrays(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays, step = {}, 0
        for opt in self.optimizers:
            for p, state in opt.state.items():
                name = self.param_names[p]
                for key, value in state.items():  # exp_avg, exp_avg_sq | momentum_buffer
                    if key != "step":
                        arrays[f"{key}.{name}"] = value.float().cpu().numpy()
                step = int(state.get("step", step))
        arrays["rng.torch"] = torch.get_rng_state().numpy()
        if self.device.type == "cuda":
            arrays["rng.cuda"] = torch.cuda.get_rng_state(self.device).numpy()
        return arrays, {"adam_step": step, "grad_scale": float(self.scaler.get_scale())
                        if self.scaler.is_enabled() else None}

    def load_optimizer_arrays(self, arrays: dict[str, np.ndarray], info: dict[str, Any]) -> None:
        step = info.get("adam_step", 0)
        muon = self.optimizers[1] if len(self.optimizers) > 1 else None
        for p, name in self.param_names.items():
            if muon is not None and f"momentum_buffer.{name}" in arrays:
                muon.state[p] = {"momentum_buffer": torch.from_numpy(
                    arrays[f"momentum_buffer.{name}"]).to(self.device, p.dtype)}
            if f"exp_avg.{name}" not in arrays:
                continue  # a checkpoint saved before the first step, or a Muon matrix
            self.optimizer.state[p] = {
                # fused AdamW keeps its step counter on the device
                "step": torch.tensor(float(step), device=self.device if self.fused else "cpu"),
                "exp_avg": torch.from_numpy(arrays[f"exp_avg.{name}"]).to(self.device, p.dtype),
                "exp_avg_sq": torch.from_numpy(arrays[f"exp_avg_sq.{name}"]).to(self.device,
                                                                               p.dtype),
            }
        if "rng.torch" in arrays:
            torch.set_rng_state(torch.from_numpy(arrays["rng.torch"]))
        if "rng.cuda" in arrays and self.device.type == "cuda":
            torch.cuda.set_rng_state(torch.from_numpy(arrays["rng.cuda"]), self.device)
        if info.get("grad_scale") and self.scaler.is_enabled():
            self.scaler.update(info["grad_scale"])
