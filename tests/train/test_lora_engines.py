"""Training with LoRA in both engines: the same losses step for step from the same weights and
batches (float64), the base weights untouched, checkpoints that hold the adapters only, and an
exact resume from the saved optimizer state (in the same engine and across engines)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from variants import ALL_LORA_TARGETS, gqa, llama

from sheepop.arch.lora import LoraConfig, adapter_param_count, adapter_shapes
from sheepop.checkpoint import format as checkpoint
from sheepop.config.schema import ModelConfig, TrainConfig
from sheepop.schedule import lr_at
from sheepop.scratch.init import init_params
from sheepop.train.engine_numpy import NumpyEngine
from sheepop.train.engine_torch import TorchEngine

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CFG = ModelConfig(vocab_size=13, block_size=8, n_layer=2, n_embd=16, d_ff=24,
                  **llama(**gqa(4, 2)))
LORA = LoraConfig(4, 8.0, ALL_LORA_TARGETS)
TCFG = TrainConfig(steps=6, lr=5e-2, min_lr=5e-3, warmup_steps=1, weight_decay=0.1,
                   grad_clip=0.05, dtype="float64", device="cpu", seed=3)


def base_weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    params = init_params(CFG, 0, np.float64)
    for v in params.values():
        v += rng.standard_normal(v.shape) * (0.2 if v.ndim > 1 else 0.1)
    return params


def batch(seed: int, B: int = 2):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, CFG.vocab_size, (B, CFG.block_size))
    y = rng.integers(0, CFG.vocab_size, (B, CFG.block_size))
    y[0, :3] = -1  # a prompt that is not trained on
    return x, y


def torch_engine(weights, adapters=None) -> TorchEngine:
    engine = TorchEngine(CFG, dataclasses.replace(TCFG, dtype="float32"), weights, LORA,
                         adapters)
    engine.model.double()  # in place: the optimizer keeps the same Parameter objects
    with torch.no_grad():  # the float64 weights exactly (loading went through float32)
        for name, p in engine.model.named_parameters():
            if name in weights:
                p.copy_(torch.from_numpy(weights[name]))
    return engine


def numpy_engine(weights, adapters=None) -> NumpyEngine:
    return NumpyEngine(CFG, TCFG, weights, LORA, adapters)


def run_steps(engine, steps: range) -> list[float]:
    losses = []
    for step in steps:
        lr = lr_at(step, TCFG.lr, TCFG.min_lr, TCFG.warmup_steps, TCFG.steps)
        micro = [batch(10 + step % 2), batch(12 + step % 2, 3)]  # accumulation
        losses.append(engine.train_step(micro, lr)[0])
    return losses


def test_lora_steps_agree_between_engines_and_leave_the_base_alone():
    weights = base_weights()
    ours, theirs = numpy_engine(weights), torch_engine(weights)
    n_adapters = adapter_param_count(CFG, LORA)
    for engine in (ours, theirs):
        assert engine.trainable_params() == n_adapters
        assert engine.num_params() == sum(v.size for v in weights.values()) + n_adapters
    x, y = batch(10)
    before = ours.eval_loss(x, y)
    assert before == pytest.approx(theirs.eval_loss(x, y), rel=1e-12)
    losses_a, losses_b = run_steps(ours, range(6)), run_steps(theirs, range(6))
    np.testing.assert_allclose(losses_a, losses_b, rtol=1e-6)
    after = ours.eval_loss(x, y)
    assert after[0] == pytest.approx(theirs.eval_loss(x, y)[0], rel=1e-6)
    assert after[0] < 0.9 * before[0]  # the adapters did learn
    # the base weights are exactly the ones given; the adapters moved
    for name, w in weights.items():
        assert np.array_equal(ours.model.params[name], w), name
        assert np.array_equal(theirs.model.get_parameter(name).detach().numpy(), w), name
    saved_a, saved_b = ours.weights(), theirs.weights()
    assert set(saved_a) == set(saved_b) == set(adapter_shapes(CFG, LORA))  # adapters only
    for name in saved_a:
        assert saved_a[name].dtype == saved_b[name].dtype == np.float32
        np.testing.assert_allclose(saved_a[name], saved_b[name], rtol=1e-5, atol=1e-6)
    assert np.abs(saved_a["blocks.0.attn.qkv.lora_B"]).max() > 1e-3  # B left zero
    # the optimizer state is the adapters' alone, under the same names in both engines
    arrays_a, info_a = ours.optimizer_arrays()
    arrays_b, info_b = theirs.optimizer_arrays()
    moments = {f"{kind}.{n}" for kind in ("exp_avg", "exp_avg_sq") for n in saved_a}
    assert set(arrays_a) - {"rng.torch"} == moments == set(arrays_b) - {"rng.torch"}
    assert info_a["adam_step"] == info_b["adam_step"] == 6


@pytest.mark.parametrize("first,second", [("numpy", "numpy"), ("torch", "torch"),
                                          ("torch", "numpy")])
def test_resume_from_a_lora_checkpoint_is_exact(tmp_path, first, second):
    make = {"numpy": numpy_engine, "torch": torch_engine}
    weights = base_weights()
    straight = make[second](weights)
    run_steps(straight, range(3))
    expected = run_steps(straight, range(3, 6))
    engine = make[first](weights)
    run_steps(engine, range(3))
    arrays, info = engine.optimizer_arrays()
    checkpoint.save_checkpoint(tmp_path, engine.weights(), {"model": {}}, "{}", arrays,
                               {"step": 3, **info})
    adapters = checkpoint.load_weights(tmp_path)
    assert set(adapters) == set(adapter_shapes(CFG, LORA))
    resumed = make[second](weights, adapters)
    resumed.load_optimizer_arrays(*checkpoint.load_trainer_state(tmp_path))
    # the checkpoint stores float32: the same engine resumes to float32 rounding of the state
    np.testing.assert_allclose(run_steps(resumed, range(3, 6)), expected, rtol=1e-6)
