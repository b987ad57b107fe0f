"""train.optimizer=muon in both engines: Muon for the blocks' matrices, AdamW for the rest; the
two engines take the same steps (float64: to rounding; float32: within float32's drift), a
killed run resumes step for step, and the combinations Muon cannot serve are refused by name."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from variants import gqa, llama

from sheepop.arch.params import uses_muon
from sheepop.config.schema import ModelConfig, TrainConfig
from sheepop.errors import UserError
from sheepop.model.gpt import cross_entropy
from sheepop.schedule import lr_at
from sheepop.scratch.init import init_params
from sheepop.scratch.muon import orthogonalize
from sheepop.train import optimizers
from sheepop.train.engine_numpy import NumpyEngine
from sheepop.train.engine_torch import TorchEngine
from sheepop.train.optimizers import StackedMuon, newton_schulz

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CFG = ModelConfig(vocab_size=13, block_size=8, n_layer=2, n_embd=16, d_ff=24, dropout=0.0,
                  **llama(**gqa(4, 2)))
TCFG = TrainConfig(steps=50, lr=1e-2, min_lr=1e-3, warmup_steps=2, weight_decay=0.1,
                   grad_clip=1.0, device="cpu", seed=3, optimizer="muon", muon_lr=0.02,
                   muon_ns_dtype="float32")


def batch(step: int, B: int = 3):
    rng = np.random.default_rng(100 + step % 7)
    x = rng.integers(0, CFG.vocab_size, (B, CFG.block_size))
    return x, (x + 1) % CFG.vocab_size  # a learnable rule: the token after x is x + 1


def engines(dtype: str, **train):
    weights = init_params(CFG, 0, np.float64)
    numpy_engine = NumpyEngine(CFG, dataclasses.replace(TCFG, dtype=dtype, **train), weights)
    torch_engine = TorchEngine(CFG, dataclasses.replace(TCFG, dtype="float32", **train), weights)
    if dtype == "float64":
        torch_engine.model.double()  # in place: the optimizers keep the same Parameters
        with torch.no_grad():
            for name, p in torch_engine.model.named_parameters():
                p.copy_(torch.from_numpy(weights[name]))
    return numpy_engine, torch_engine


@pytest.mark.parametrize("shape", [(3, 32, 96), (3, 96, 32), (2, 48, 48), (2, 20, 31)])
def test_torch_orthogonalises_a_stack_as_numpy_does_each_matrix(shape):
    """StackedMuon's batched iteration (both its plain and its Gram form) on a stack of one
    shape equals the NumPy unit on each matrix, in float64 to rounding."""
    stack = np.random.default_rng(4).standard_normal(shape)
    got = newton_schulz(torch.from_numpy(stack), 5, (3.4445, -4.7750, 2.0315), 1e-7).numpy()
    for g, m in zip(got, stack):
        np.testing.assert_allclose(g, orthogonalize(m), rtol=0, atol=1e-13)
    one = newton_schulz(torch.from_numpy(stack[0]), 5, (3.4445, -4.7750, 2.0315), 1e-7)
    np.testing.assert_allclose(one.numpy(), got[0], rtol=0, atol=1e-13)  # a single matrix too


COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def decaying(shape: tuple[int, int], seed: int, smallest: float) -> np.ndarray:
    """A matrix with singular values from 1 down to `smallest`, spaced logarithmically: a
    momentum of gradients has a few large directions and many small ones."""
    rng = np.random.default_rng(seed)
    k = min(shape)
    u = np.linalg.qr(rng.standard_normal((shape[0], k)))[0]
    v = np.linalg.qr(rng.standard_normal((shape[1], k)))[0]
    return (u * np.logspace(0, np.log10(smallest), k)) @ v.T


@pytest.mark.parametrize("shape", [(96, 288), (288, 96), (64, 256)])
@pytest.mark.parametrize("smallest", [1e-2, 1e-4, 1e-6])
def test_the_bfloat16_gram_form_restarts_within_bfloat16s_bound(shape, smallest, monkeypatch):
    """In bfloat16 the Gram form starts again from X after HALF_PRECISION_GRAM_STEPS steps and
    stays within bfloat16's bound of the float64 iteration (the plain one to rounding, above),
    k sqrt(n) 2^-8 (0.31-0.33 here; measured 0.04-0.17). Without the restart (one Gram run of
    all five steps) the same matrices end 0.8-50 away: A <- Q A Q in bfloat16 drifts with
    nothing to pull it back."""
    bound = 5 * np.sqrt(max(shape)) * 2.0 ** -8

    def error() -> float:
        m = decaying(shape, 0, smallest)
        got = newton_schulz(torch.from_numpy(m).bfloat16(), 5, COEFFICIENTS, 1e-7)
        expected = newton_schulz(torch.from_numpy(m), 5, COEFFICIENTS, 1e-7).numpy()
        return float(np.linalg.norm(got.double().numpy() - expected) / np.linalg.norm(expected))

    assert error() <= bound
    monkeypatch.setattr(optimizers, "HALF_PRECISION_GRAM_STEPS", 5)
    assert error() > bound


def test_stacked_muon_in_bfloat16_steps_as_torch_muon():
    """StackedMuon with a bfloat16 iteration (through the Gram form for wide matrices) and
    torch.optim.Muon (its plain bfloat16 iteration, one matrix at a time) take the same steps:
    each step's update within twice bfloat16's bound of the other (both are within one of the
    float64 iteration), the parameters re-synced after each step."""
    rng = np.random.default_rng(7)
    shapes = [(48, 144), (48, 144), (144, 48), (48, 48)]
    start = [torch.from_numpy(rng.standard_normal(s).astype(np.float32)) for s in shapes]
    ours = [torch.nn.Parameter(w.clone()) for w in start]
    theirs = [torch.nn.Parameter(w.clone()) for w in start]
    settings = dict(lr=0.02, momentum=0.9, nesterov=True, weight_decay=0.0, ns_steps=5)
    mine, torch_muon = StackedMuon(ours, torch.bfloat16, **settings), torch.optim.Muon(theirs,
                                                                                     **settings)
    for step in range(3):
        for a, b in zip(ours, theirs):
            g = torch.from_numpy(decaying(tuple(a.shape), step, 1e-4).astype(np.float32))
            a.grad, b.grad = g.clone(), g.clone()
        before = [a.detach().clone() for a in ours]
        mine.step()
        torch_muon.step()
        for a, b, w in zip(ours, theirs, before):
            ours_step, their_step = w - a.detach(), w - b.detach()
            bound = 2 * 5 * np.sqrt(max(a.shape)) * 2.0 ** -8
            assert (ours_step - their_step).norm() <= bound * their_step.norm()
            with torch.no_grad():
                a.copy_(b)


@pytest.mark.parametrize("setting, native, expected", [
    ("auto", True, torch.bfloat16), ("auto", False, None), ("bfloat16", False, torch.bfloat16),
    ("float32", True, None)])
def test_train_muon_ns_dtype_chooses_the_iterations_dtype(setting, native, expected):
    """auto: bfloat16 where the device has bf16 instructions, else the parameters' own dtype
    (None); bfloat16 and float32 whatever the device."""
    named = list(torch.nn.Linear(8, 8, bias=False).named_parameters(prefix="blocks.0.attn.proj"))
    cfg = dataclasses.replace(TCFG, muon_ns_dtype=setting)
    muon = optimizers.build_optimizers(named, cfg, fused=False, native_bf16=native)[1]
    assert muon.ns_dtype == expected


def run_steps(engine, steps: range) -> list[float]:
    return [engine.train_step([batch(s)], lr_at(s, TCFG.lr, TCFG.min_lr, TCFG.warmup_steps,
                                                 TCFG.steps))[0] for s in steps]


def test_muon_takes_the_matrices_and_adamw_the_rest_in_both_engines():
    ours, theirs = engines("float32")
    run_steps(ours, range(1))
    run_steps(theirs, range(1))
    for engine in (ours, theirs):
        arrays, _ = engine.optimizer_arrays()
        for name, p in init_params(CFG, 0).items():
            muon = uses_muon(name, p.shape)
            assert (f"momentum_buffer.{name}" in arrays) == muon, name
            assert (f"exp_avg.{name}" in arrays) == (not muon), name
    # a layer's qkv (fused), attention projection, gate, up and down projection
    assert sum(uses_muon(n, p.shape) for n, p in init_params(CFG, 0).items()) == 2 * 5
    assert isinstance(theirs.optimizers[1], StackedMuon)
    assert theirs.optimizers[1].ns_dtype is None  # train.muon_ns_dtype=float32: the params'


def test_the_first_muon_step_is_the_orthogonalised_gradient():
    """From a zero momentum, Nesterov's update is (1 - mu^2) G and Muon's matrices take no
    weight decay, so the step is lr sqrt(max(1, m/n)) NS_5(G): the torch engine's step equals
    the NumPy engine's NS_5 of the same gradient (relative 1e-5: float32's NS bound, 5 sqrt(24)
    2^-24 ~ 1.5e-6, plus the rounding of W - step for a step ~1/10 of W)."""
    _, engine = engines("float32")
    name = "blocks.0.ffn.up.weight"
    p = engine.model.get_parameter(name)
    x, y = (torch.from_numpy(a) for a in batch(0))
    cross_entropy(engine.model(x)[0], y).backward()
    gradient = p.grad.detach().numpy().copy()
    engine.model.zero_grad(set_to_none=True)
    before = p.detach().clone()
    lr = lr_at(0, TCFG.lr, TCFG.min_lr, TCFG.warmup_steps, TCFG.steps)
    engine.train_step([batch(0)], lr)
    rows, cols = before.shape
    scale = TCFG.muon_lr * lr / TCFG.lr * max(1.0, rows / cols) ** 0.5
    step = ((before - p.detach()) / scale).numpy()
    expected = orthogonalize(gradient)
    assert np.linalg.norm(step - expected) <= 1e-5 * np.linalg.norm(expected)


def test_the_engines_take_the_same_muon_steps_in_float64():
    ours, theirs = engines("float64")
    np.testing.assert_allclose(run_steps(ours, range(10)), run_steps(theirs, range(10)),
                               rtol=1e-10)


def test_train_muon_ns_steps_reaches_both_engines():
    """Two Newton-Schulz steps instead of 5: both engines take the same steps (float64, to
    rounding), and not the steps of 5 (the loss after 4 steps differs by far more)."""
    ours, theirs = engines("float64", muon_ns_steps=2)
    assert theirs.optimizers[1].param_groups[0]["ns_steps"] == ours.muon.ns_steps == 2
    two = run_steps(ours, range(4))
    np.testing.assert_allclose(two, run_steps(theirs, range(4)), rtol=1e-10)
    five = run_steps(engines("float64")[0], range(4))
    assert abs(two[-1] - five[-1]) > 1e-6 * five[-1]


def test_the_engines_take_the_same_muon_steps_in_float32_for_50_steps():
    """The same float32 iteration in both: the losses differ only by the order each engine sums
    in (rounding of 2^-24 an operation, which training carries forward). Measured: 2.8e-7 of the
    loss at most over 50 steps (AVX2); the bound 1e-4 leaves 300x for other CPUs' orders and
    still tells a different update apart (torch's bfloat16 iteration: 7.7e-4)."""
    ours, theirs = engines("float32")
    a, b = run_steps(ours, range(50)), run_steps(theirs, range(50))
    np.testing.assert_allclose(a, b, rtol=1e-4)
    assert a[-1] < 0.5 * a[0]  # and Muon did learn the rule


@pytest.mark.parametrize("engine", ["numpy", "torch"])
def test_a_muon_run_resumes_step_for_step(tmp_path, engine, interrupt_after, tiny_config,
                                          tiny_trainer, read_metrics):
    cfg = dict(engine=engine, optimizer="muon")
    tiny_trainer(tiny_config(**cfg), tmp_path / "a").run()
    first = tiny_trainer(tiny_config(**cfg), tmp_path / "b")
    interrupt_after(first, 5)
    assert first.run().interrupted
    resumed = tiny_trainer(tiny_config(**cfg), tmp_path / "b", resume=True)
    assert resumed.step == 5
    resumed.run()
    a, b = read_metrics(tmp_path / "a"), read_metrics(tmp_path / "b")
    assert [r["loss"] for r in a] == [r["loss"] for r in b]


def test_resuming_with_another_optimizer_is_refused(tmp_path, interrupt_after, tiny_config,
                                                    tiny_trainer):
    first = tiny_trainer(tiny_config(), tmp_path / "run")
    interrupt_after(first, 2)
    first.run()
    with pytest.raises(UserError, match="train.optimizer=adamw: resume it with the same"):
        tiny_trainer(tiny_config(optimizer="muon"), tmp_path / "run", resume=True)


@pytest.mark.parametrize("setting,message", [
    ("train.fsdp=true", "use DDP"), ("lora.rank=4", "LoRA's adapters"),
    ("train.muon_lr=0", "muon_lr must be positive"),
    ("train.muon_momentum=1", "muon_momentum in"), ("train.optimizer=sgd", "adamw, muon")])
def test_what_muon_cannot_serve_is_refused(tiny_config, setting, message):
    cfg = tiny_config(optimizer="muon")
    key, value = setting.split("=")
    cfg.set(key, value)
    with pytest.raises(UserError, match=message):
        cfg.validate()
