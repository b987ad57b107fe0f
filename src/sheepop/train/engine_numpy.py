"""The NumPy engine's adapter for the training loop (see `sheepop.train.loop.Engine`).

The same contract as the torch adapter: one AdamW step on a list of micro-batches, with exact
gradient accumulation. With N the number of counted (non-padding) targets over all
micro-batches, micro-batch j (n_j counted targets, mean loss L_j) contributes the gradient of
n_j L_j / N, i.e. its backward runs with dloss = n_j / N; the sum is the gradient of the
large-batch mean loss whatever the padding. Weights, moments and the Adam step are saved under the
same names as the torch engine's, so either engine resumes the other's checkpoint.

With LoRA (`lora`) the given weights are frozen and AdamW updates the adapters only (the same
rule as the torch engine, weight decay on A and B included); `weights()` is then the adapters.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sheepop.arch import IGNORE_INDEX
from sheepop.arch.lora import LoraConfig
from sheepop.arch.params import uses_muon
from sheepop.config.schema import ModelConfig, TrainConfig
from sheepop.scratch.adamw import AdamW, clip_grad_norm
from sheepop.scratch.gpt import GPT, uses_rng
from sheepop.scratch.logprob import token_logprob_backward, token_logprob_forward
from sheepop.scratch.lora import LoraGPT
from sheepop.scratch.muon import Muon
from sheepop.train.logprobs import LossOfLogprobs


def resolve_dtype(name: str) -> type:
    """float64 when asked for; float32 otherwise. NumPy has no bfloat16 arithmetic, and float16
    would be slower than float32 on a CPU, so those (torch-engine) settings fall back to float32
    (the description says so) rather than failing: a run trained by the torch engine in bf16
    still evaluates and resumes here."""
    return np.float64 if name == "float64" else np.float32


class NumpyEngine:
    name = "numpy"

    def __init__(self, model_cfg: ModelConfig, train_cfg: TrainConfig,
                 weights: dict[str, np.ndarray] | None = None, lora: LoraConfig | None = None,
                 adapters: dict[str, np.ndarray] | None = None):
        """`weights` (None: fresh ones by the config's seed); with `lora`, those weights are
        frozen and the adapters train, starting from `adapters` (None: fresh, B = 0)."""
        self.cfg = train_cfg
        self.model_cfg = model_cfg
        self.lora = lora
        self.dtype = np.dtype(resolve_dtype(train_cfg.dtype))
        self.model = GPT(model_cfg, weights, self.dtype, seed=train_cfg.seed) if lora is None \
            else LoraGPT(model_cfg, weights, self.dtype, seed=train_cfg.seed, lora=lora,
                         adapters=adapters)
        trainable = {name: self.model.params[name] for name in self.model.grads}
        # train.optimizer=muon: the blocks' matrices to Muon (no weight decay, as the torch
        # engine's), the rest to AdamW (sheepop.train.optimizers says why).
        matrices = {n: p for n, p in trainable.items()
                    if train_cfg.optimizer == "muon" and uses_muon(n, p.shape)}
        self.optimizer = AdamW({n: p for n, p in trainable.items() if n not in matrices},
                               lr=train_cfg.lr, betas=(train_cfg.beta1, train_cfg.beta2),
                               eps=train_cfg.eps, weight_decay=train_cfg.weight_decay)
        self.muon = Muon(matrices, lr=train_cfg.muon_lr, momentum=train_cfg.muon_momentum,
                         ns_steps=train_cfg.muon_ns_steps) if matrices else None
        # Dropout masks come from their own seeded generator, saved with the checkpoint.
        self.rng = np.random.default_rng(train_cfg.seed)

    @property
    def description(self) -> str:
        asked = self.cfg.dtype
        note = f" (train.dtype={asked} is torch-only)" if asked in ("bfloat16", "float16") else ""
        return f"numpy (scratch engine), {self.dtype.name}{note}"

    def num_params(self) -> int:
        """Every parameter, adapters included."""
        return self.model.num_params()

    def trainable_params(self) -> int:
        """The parameters AdamW updates: all of them, or the adapters under LoRA."""
        return self.model.trainable_params()

    def train_step(self, micro_batches: list[tuple[np.ndarray, np.ndarray]], lr: float,
                   total_count: int | None = None) -> tuple[float, float]:
        """One optimizer step; returns (mean loss over counted targets, gradient norm before
        clipping)."""
        counts = [int((y != IGNORE_INDEX).sum()) for _, y in micro_batches]
        total = max(total_count or sum(counts), 1)
        # The rng draws dropout masks and the positions' training draws: without it a forward
        # is an evaluation (no dropout, no draws).
        rng = self.rng if uses_rng(self.model_cfg) else None
        self.model.zero_grad()
        loss_sum = 0.0
        for (x, y), n in zip(micro_batches, counts):
            if n == 0:
                continue  # all padding: no loss, no gradient
            _, loss = self.model.forward(x, y, rng)
            loss_sum += loss * n
            self.model.backward(n / total)
        return loss_sum / total, self._update(lr)

    def _update(self, lr: float) -> float:
        """Clip the accumulated gradients and step the optimizers; the norm before clipping."""
        norm = clip_grad_norm(self.model.grads, self.cfg.grad_clip)
        self.optimizer.step(self.model.grads, lr)
        if self.muon is not None:
            self.muon.step(self.model.grads, self.cfg.muon_lr * lr / self.cfg.lr)
        return norm

    def token_logprobs(self, x: np.ndarray, y: np.ndarray, adapters_off: bool = False
                       ) -> np.ndarray:
        """log pi(y_t | x_<=t) (B, T) float64, 0 where y is IGNORE_INDEX; no dropout, nothing
        kept for a backward. `adapters_off`: the base model's under LoRA
        (sheepop.scratch.lora.LoraGPT.base_logits), the reference that stays put while the
        adapters train."""
        if adapters_off:
            if not isinstance(self.model, LoraGPT):
                raise ValueError("adapters_off needs a model with LoRA adapters")
            logits = self.model.base_logits(x)
        else:
            logits = self.model.forward_pass(x, None, None)[0]
        return token_logprob_forward(logits, y)[0]

    def logprob_step(self, batches: list[tuple[np.ndarray, np.ndarray]], lr: float,
                     loss_of: LossOfLogprobs) -> tuple[float, float]:
        """One optimizer step on a loss of the per-token log-probabilities
        (sheepop.train.logprobs): for each batch, logp by the forward pass, (L_i, g) =
        loss_of(i, logp), then the hand-written backward from dL/dz_t = g_t (onehot(y_t) -
        softmax(z_t)) (sheepop.scratch.logprob). Returns (sum of the L_i, gradient norm before
        clipping)."""
        rng = self.rng if uses_rng(self.model_cfg) else None
        self.model.zero_grad()
        total = 0.0
        for i, (x, y) in enumerate(batches):
            logits, _ = self.model.forward(x, None, rng)
            logp, cache = token_logprob_forward(logits, y)
            loss, dlogp = loss_of(i, logp)
            self.model.backward(dlogits=token_logprob_backward(dlogp, cache))
            total += float(loss)
        return total, self._update(lr)

    def eval_loss(self, x: np.ndarray, y: np.ndarray) -> tuple[float, int]:
        """(sum of token losses, number of counted targets) on one batch, no dropout."""
        n = int((y != IGNORE_INDEX).sum())
        if n == 0:
            return 0.0, 0
        return self.model.loss(x, y) * n, n

    def weights(self) -> dict[str, np.ndarray]:
        """What a checkpoint saves: every weight, or the adapters alone under LoRA."""
        if self.lora is not None:
            return {name: self.model.params[name].astype(np.float32) for name in self.model.grads}
        return self.model.numpy_weights()

    def optimizer_arrays(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays = self.optimizer.state_arrays() if self.optimizer.t > 0 else {}
        if self.muon is not None and self.optimizer.t > 0:
            arrays.update(self.muon.state_arrays())
        return arrays, {"adam_step": self.optimizer.t,
                        "numpy_rng": self.rng.bit_generator.state}

    def load_optimizer_arrays(self, arrays: dict[str, np.ndarray], info: dict[str, Any]) -> None:
        self.optimizer.load_state_arrays(arrays, info.get("adam_step", 0))
        if self.muon is not None:
            self.muon.load_state_arrays(arrays)
        if info.get("numpy_rng"):
            self.rng.bit_generator.state = info["numpy_rng"]
