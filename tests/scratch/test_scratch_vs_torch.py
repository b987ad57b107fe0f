"""The scratch engine against torch autograd: same weights and inputs, same loss, same gradients,
same AdamW trajectory, and checkpoints that load in either engine with the same logits."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from variants import RMSNORM, ROPE, SWIGLU, gqa, llama

from sheepop.checkpoint import format as checkpoint
from sheepop.config.schema import ModelConfig, TrainConfig
from sheepop.model import GPT as TorchGPT
from sheepop.schedule import lr_at
from sheepop.scratch.gpt import GPT, gpt_backward, gpt_forward
from sheepop.scratch.init import init_params
from sheepop.train.engine_numpy import NumpyEngine
from sheepop.train.engine_torch import TorchEngine

MODEL_VARIANTS = [
    {},
    {"tie_weights": False, "head_bias": True, "pos_encoding": "learned"},
    {"n_head": 1, "bias": False, "activation": "gelu_tanh"},
    {"n_head": 4, "activation": "relu", "n_layer": 3},
    {"activation": "relu2", "bias": False, "logit_softcap": 2.0},  # the modern recipe's
    {**ROPE, **gqa(4, 2), "qk_norm": True, "bias": False},
    {**ROPE, **gqa(4, 2), "value_embeds": 2, "n_layer": 5},   # value embeddings, grouped
    {"unet_skips": True, "n_layer": 5, "value_embeds": 1},     # U-net skips, a middle block
    {**RMSNORM, "bias": False},
    # The modern decoder, in the combinations that matter (issue 14).
    {**ROPE, **gqa(4, 1)},                                    # rope + MQA
    {**ROPE, **gqa(4, 2), "bias": False},                     # rope + GQA
    {**RMSNORM, **SWIGLU},                                    # with biases
    llama(n_kv_head=1),                                       # Llama-shaped, multi-query
]


def config(**kw) -> ModelConfig:
    base = dict(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16, d_ff=24)
    base.update(kw)
    return ModelConfig(**base)


def perturbed_params(cfg: ModelConfig, dtype, seed: int = 0) -> dict[str, np.ndarray]:
    """Initial weights plus noise, so every gradient (LayerNorm, biases) is far from zero."""
    rng = np.random.default_rng(seed)
    params = init_params(cfg, seed, np.float64)
    for v in params.values():
        v += rng.standard_normal(v.shape) * (0.2 if v.ndim > 1 else 0.1)
    return {k: v.astype(dtype) for k, v in params.items()}


def torch_model(cfg: ModelConfig, params: dict[str, np.ndarray]) -> TorchGPT:
    """A torch GPT holding exactly `params` (in their dtype: float64 stays float64)."""
    model = TorchGPT(cfg)
    if next(iter(params.values())).dtype == np.float64:
        model = model.double()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.from_numpy(params[name]))
    return model


def batch(cfg: ModelConfig, B: int, seed: int, pad: bool = True):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, cfg.vocab_size, (B, cfg.block_size))
    y = rng.integers(0, cfg.vocab_size, (B, cfg.block_size))
    if pad:
        y[0, -3:] = -1
    return x, y


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a.astype(np.float64) - b.astype(np.float64))
                 / np.linalg.norm(b.astype(np.float64)))


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-6), (np.float32, 1e-4)])
@pytest.mark.parametrize("kw", MODEL_VARIANTS)
def test_gradients_match_torch_autograd(kw, dtype, tol):
    cfg = config(**kw)
    params = perturbed_params(cfg, dtype)
    x, y = batch(cfg, 3, 1)
    logits, loss, cache = gpt_forward(params, cfg, x, y)
    grads = gpt_backward(cache)

    model = torch_model(cfg, params)
    t_logits, t_loss = model(torch.from_numpy(x), torch.from_numpy(y))
    t_loss.backward()
    assert logits.dtype == dtype
    assert rel(logits, t_logits.detach().numpy()) <= tol
    assert abs(loss - t_loss.item()) <= tol * abs(t_loss.item())
    t_grads = {n: p.grad.numpy() for n, p in model.named_parameters()}
    assert set(grads) == set(t_grads)
    errors = {n: rel(grads[n], t_grads[n]) for n in grads}
    assert max(errors.values()) <= tol, errors


def _torch_engine(cfg: ModelConfig, tcfg: TrainConfig, params: dict[str, np.ndarray]):
    engine = TorchEngine(cfg, dataclasses.replace(tcfg, dtype="float32"))
    engine.model.double()  # in place: the optimizer keeps the same Parameter objects
    with torch.no_grad():
        for name, p in engine.model.named_parameters():
            p.copy_(torch.from_numpy(params[name]))
    return engine


def test_ten_adamw_steps_match_torch_in_float64():
    cfg = config(tie_weights=True)
    tcfg = TrainConfig(steps=10, lr=3e-3, min_lr=3e-4, warmup_steps=3, weight_decay=0.1,
                       grad_clip=0.5, beta2=0.95, dtype="float64", device="cpu", seed=0)
    params = perturbed_params(cfg, np.float64, seed=3)
    ours = NumpyEngine(cfg, tcfg, params)
    theirs = _torch_engine(cfg, tcfg, params)
    for step in range(10):
        lr = lr_at(step, tcfg.lr, tcfg.min_lr, tcfg.warmup_steps, tcfg.steps)
        micro = [batch(cfg, 2, 100 + 2 * step), batch(cfg, 3, 101 + 2 * step)]  # accumulation
        loss_a, norm_a = ours.train_step(micro, lr)
        loss_b, norm_b = theirs.train_step(micro, lr)
        assert abs(loss_a - loss_b) <= 1e-5 * abs(loss_b), (step, loss_a, loss_b)
        assert abs(norm_a - norm_b) <= 1e-5 * norm_b
    assert norm_b > tcfg.grad_clip  # clipping did act in this run
    for name, p in theirs.model.named_parameters():
        assert rel(ours.model.params[name], p.detach().numpy()) <= 1e-7, name


@pytest.mark.parametrize("kw", [{"pos_encoding": "learned", "tie_weights": False},
                                llama(n_kv_head=1),
                                {**ROPE, "value_embeds": 1, "unet_skips": True, "n_layer": 3}])
def test_checkpoints_cross_load_with_the_same_logits(tmp_path, kw):
    cfg = config(**kw)
    tcfg = TrainConfig(steps=3, lr=1e-2, warmup_steps=1, device="cpu", seed=5, dtype="float32")
    x, y = batch(cfg, 2, 7, pad=False)
    for trainer_cls, name in ((NumpyEngine, "numpy"), (TorchEngine, "torch")):
        engine = trainer_cls(cfg, tcfg)
        for _ in range(3):
            engine.train_step([batch(cfg, 2, 8)], 1e-2)
        run = tmp_path / name
        arrays, info = engine.optimizer_arrays()
        checkpoint.save_checkpoint(run, engine.weights(), {"model": {}}, "{}", arrays,
                                   {"step": 3, **info})
        weights = checkpoint.load_weights(run)
        t_model = TorchGPT(cfg)
        t_model.load_numpy_weights(weights)
        with torch.no_grad():
            t_logits = t_model(torch.from_numpy(x))[0].numpy()
        n_logits = GPT(cfg, weights).forward(x)[0]
        np.testing.assert_allclose(n_logits, t_logits, rtol=0, atol=2e-5)
        # The optimizer state resumes in the other engine too.
        other = (TorchEngine if name == "numpy" else NumpyEngine)(cfg, tcfg, weights)
        other.load_optimizer_arrays(*checkpoint.load_trainer_state(run))
        assert other.optimizer_arrays()[1]["adam_step"] == 3
