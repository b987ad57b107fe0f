"""benchmarks/speedrun.py's reference is nanoGPT's recipe in nanoGPT's own form
(benchmarks/nanogpt_reference.py), so its target loss L must be measured exactly as a sheepop
run measures its own: the same batches, the same held-out windows, the same mean. From the same
weights the two evaluations agree, and the schedule is nanoGPT's get_lr."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from sheepop.config.build import build_config
from sheepop.config.schema import DataConfig
from sheepop.data.dataset import load_dataset
from sheepop.train.start import setup

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))  # speedrun imports machine and nanogpt_reference as siblings
spec = importlib.util.spec_from_file_location("speedrun", BENCHMARKS / "speedrun.py")
speedrun = importlib.util.module_from_spec(spec)
sys.modules["speedrun"] = speedrun  # its dataclass looks its module up
spec.loader.exec_module(speedrun)
nanogpt = sys.modules["nanogpt_reference"]

SCALE = speedrun.Scale({"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 16,
                        "batch_size": 4}, DataConfig(tokenizer="char", max_bytes=30_000),
                       steps=4, eval_every=2)


def test_the_schedule_is_nanogpts_get_lr():
    lr = [nanogpt.nanogpt_lr(it, 1e-3, 1e-4, 100, 300) for it in range(302)]
    assert lr[0] == pytest.approx(1e-3 / 101) and lr[99] == pytest.approx(1e-3 * 100 / 101)
    assert lr[100] == pytest.approx(1e-3)  # the cosine's top, where the warmup ends
    assert lr[200] == pytest.approx(0.5 * (1e-3 + 1e-4))  # half-way down the cosine
    assert lr[300] == pytest.approx(1e-4) and lr[301] == 1e-4
    assert all(a >= b for a, b in zip(lr[100:], lr[101:]))


def test_the_reference_is_measured_on_sheepops_batches_and_windows(tmp_path):
    dataset = load_dataset(None, SCALE.data)
    cfg = build_config(None, None, [*speedrun.shape_settings(SCALE, "float32", 1),
                                    *speedrun.NANOGPT, "train.steps=4", "train.seed=3"])
    trainer = setup(None, cfg, tmp_path / "run", dataset=dataset, progress=False,
                    log=lambda *_: None)
    next_batch, evaluate = speedrun.reference_data(dataset, SCALE, seed=3)
    for _ in range(3):  # the same windows, drawn in the same order
        ours, theirs = trainer.sampler.next_batch(), next_batch()
        np.testing.assert_array_equal(ours[0], theirs[0])
        np.testing.assert_array_equal(ours[1], theirs[1])
    s = SCALE.shape
    model = nanogpt.ReferenceGPT(nanogpt.Shape(s["n_layer"], s["n_head"], s["n_embd"],
                                               s["block_size"], dataset.tokenizer.vocab_size))
    nanogpt.load_sheepop_weights(model, trainer.engine.weights(), s["n_layer"])
    with torch.no_grad():
        theirs = evaluate(model.eval())
    ours = trainer.evaluate()[0]
    # The mean of ~20 x 4 x 16 float32 losses of a 2-layer model, summed in another order:
    # float32's rounding, not a model's difference (a fresh model's loss is ~log V, 4+).
    assert abs(ours - theirs) < 1e-5 * ours and ours > math.log(dataset.tokenizer.vocab_size) - 1


def test_the_reference_loop_learns_and_reports_each_evaluation():
    dataset = load_dataset(None, SCALE.data)
    next_batch, evaluate = speedrun.reference_data(dataset, SCALE, seed=0)
    torch.manual_seed(0)
    s = SCALE.shape
    model = nanogpt.ReferenceGPT(nanogpt.Shape(s["n_layer"], s["n_head"], s["n_embd"],
                                               s["block_size"], dataset.tokenizer.vocab_size))
    with torch.no_grad():
        start = evaluate(model.eval())
    history = nanogpt.train_reference(model, next_batch, 40, evaluate, eval_every=20,
                                      recipe=nanogpt.Recipe(lr=3e-3, warmup=5))
    assert [h[0] for h in history] == [20, 40]
    assert 0 < history[0][1] < history[1][1]
    assert history[-1][2] < start - 0.5  # from ~log V: it learns the characters' frequencies


def test_the_reference_trained_again_is_the_same_run():
    """`--reference-after` times the reference a second time after the recipes and takes the mean
    of the two times: that is fair only if the second run is the same computation, to the bit."""
    dataset = load_dataset(None, SCALE.data)
    first, again = (speedrun.train_nanogpt(dataset, SCALE, SCALE.steps, 5, None, SCALE.eval_every)
                    for _ in range(2))
    assert first["val"] == again["val"] and first["seconds"] > 0 and again["seconds"] > 0


def test_a_budget_run_is_judged_by_its_one_evaluation_at_the_end():
    """`--budget S`: the recipe trains exactly S steps, evaluated once at step S; it reaches L
    when that loss is at or below L, at step S, whatever the loss did before."""
    dataset = load_dataset(None, SCALE.data)
    settings = [*speedrun.shape_settings(SCALE, "float32", 1), *speedrun.NANOGPT,
                *(s for sets in speedrun.RECIPE.values() for s in sets)]
    above = speedrun.train_sheepop(dataset, settings, 6, 1, 6, target=0.5)
    assert above["reached_step"] is None and above["val"] > 0.5  # a 6-step model's loss is ~3+
    below = speedrun.train_sheepop(dataset, settings, 6, 1, 6, target=above["val"])
    assert below["reached_step"] == 6 and below["val"] == above["val"]  # the same run, to the bit
