"""benchmarks/vs_nanogpt.py races like against like: its re-implementation of nanoGPT's step
computes the same model as sheepop's torch engine at that shape. From the same weights, on the
same batches, with the same AdamW settings, the two give the same losses step after step."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))  # vs_nanogpt imports nanogpt_reference as a sibling
spec = importlib.util.spec_from_file_location("vs_nanogpt", BENCHMARKS / "vs_nanogpt.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
reference = sys.modules["nanogpt_reference"]


def test_the_reimplementation_trains_exactly_like_sheepop_from_the_same_weights():
    shape = reference.Shape(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=11)
    ours = bench.sheepop_step(shape, 4, "float32", [])
    engine = ours.engine
    model = reference.ReferenceGPT(shape)
    assert sorted(reference.sheepop_names(2).values()) == sorted(engine.weights())
    reference.load_sheepop_weights(model, engine.weights(), 2)
    theirs = reference.ReferenceStep(model.train())
    counting = (torch.arange(4)[:, None] + torch.arange(17)) % 11  # learnable: next = this + 1
    pairs = (counting[:, :-1].contiguous(), counting[:, 1:].contiguous())
    data = [pairs] * 6 + bench.batches(shape, 4, 2) \
        + [pairs] * 4
    losses = [(ours(x, y), theirs(x, y)) for x, y in data]
    a, b = np.array(losses).T
    assert a[0] == np.float32(a[0]) and abs(a[0] - np.log(11)) < 0.05  # a fresh model's loss
    np.testing.assert_allclose(a, b, rtol=0, atol=2e-5)
    assert a[-1] < a[0] - 0.3  # and they learn
    for name, w in engine.weights().items():  # the weights agree after 12 AdamW steps
        mine = dict(model.named_parameters())[
            {v: k for k, v in reference.sheepop_names(2).items()}[name]]
        np.testing.assert_allclose(mine.detach().numpy(), w, rtol=0, atol=1e-5)


def test_the_race_alternates_and_times_every_step_of_each():
    calls = []
    steps = {"a": lambda x, y: calls.append("a"), "b": lambda x, y: calls.append("b")}
    data = [(torch.zeros(1), torch.zeros(1))]
    times = bench.race(steps, data, iters=3, warmup=1)
    assert calls == ["a", "b", "a", "b", "b", "a", "a", "b"]
    assert [len(t) for t in times.values()] == [3, 3]
