"""The torch engine's training: schedule, parameter groups, accumulation, the shared loop (run
directory, resume, Ctrl-C), bf16 autocast. The tiny run's fixtures are in tests/conftest.py."""

import json
import math

import numpy as np
import pytest
import torch

from sheepop.config.schema import TrainConfig
from sheepop.schedule import lr_at, lr_for, wsd_lr_at
from sheepop.train.engine_torch import TorchEngine
from sheepop.train.loop import evaluation_record
from sheepop.train.optimizers import decay_groups
from sheepop.train.progress import evaluation_line


def test_schedule_warmup_then_cosine():
    assert lr_at(0, 1.0, 0.1, 10, 110) == pytest.approx(0.1)
    assert lr_at(9, 1.0, 0.1, 10, 110) == pytest.approx(1.0)
    assert lr_at(10, 1.0, 0.1, 10, 110) == pytest.approx(1.0)
    assert lr_at(60, 1.0, 0.1, 10, 110) == pytest.approx(0.55)  # half way: (1 + 0.1) / 2
    assert lr_at(110, 1.0, 0.1, 10, 110) == pytest.approx(0.1)
    assert lr_at(500, 1.0, 0.1, 10, 110) == pytest.approx(0.1)


def test_schedule_warmup_stable_decay():
    """lr_max after the warmup until the last ceil(0.2 * 100) = 20 steps, then a straight line
    that reaches min_lr at step 100; lr_for chooses it by train.schedule."""
    lrs = [wsd_lr_at(s, 1.0, 0.1, 10, 100, 0.2) for s in range(120)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert lrs[10:81] == [1.0] * 71
    assert lrs[90] == pytest.approx(0.1 + 0.9 * 10 / 20)
    assert all(a > b for a, b in zip(lrs[80:100], lrs[81:101]))  # strictly down, linearly
    assert lrs[100:] == [0.1] * 20
    cfg = TrainConfig(steps=100, lr=1.0, min_lr=0.1, warmup_steps=10, schedule="wsd")
    assert [lr_for(s, cfg) for s in range(120)] == lrs
    assert lr_for(50, TrainConfig(steps=100, lr=1.0, min_lr=0.1, warmup_steps=10)) < 1.0


def test_no_weight_decay_on_biases_and_layernorm(small_cfg):
    from sheepop.model import GPT
    model = GPT(small_cfg)
    decay, no_decay = decay_groups(list(model.parameters()), 0.1)
    names = {p: n for n, p in model.named_parameters()}
    assert all(names[p].endswith("weight") and "ln" not in names[p] for p in decay["params"])
    assert {names[p] for p in no_decay["params"]} >= {"ln_f.weight", "ln_f.bias",
                                                      "blocks.0.attn.qkv.bias"}


@pytest.mark.parametrize("pad", [False, True])
def test_accumulating_4_micro_batches_equals_one_batch_of_4B(small_cfg, pad):
    rng = np.random.default_rng(0)
    x = rng.integers(0, small_cfg.vocab_size, (8, 16))
    y = rng.integers(0, small_cfg.vocab_size, (8, 16))
    if pad:  # padded targets are uneven across micro-batches: the mean must still be exact
        y[1, 5:] = -1
        y[6, 2:] = -1
    grads = []
    for micro in ([(x, y)], [(x[i:i + 2], y[i:i + 2]) for i in range(0, 8, 2)]):
        tc = TrainConfig(grad_clip=0.0, seed=1, lr=0.0, weight_decay=0.0)
        engine = TorchEngine(small_cfg, tc)
        # lr = 0: the step leaves weights untouched; read the gradient from the moments.
        loss, _ = engine.train_step(micro, lr=0.0)
        m = {n: st["exp_avg"] / (1 - 0.9) for p, st in engine.optimizer.state.items()
             for n in [engine.param_names[p]]}
        grads.append((loss, m))
    (l1, g1), (l4, g4) = grads
    assert l1 == pytest.approx(l4, abs=1e-6)
    for name in g1:
        assert torch.allclose(g1[name], g4[name], atol=1e-6, rtol=0), name


def test_training_lowers_the_loss_and_writes_a_run(tmp_path, tiny_config, tiny_trainer,
                                                   read_metrics):
    cfg = tiny_config(steps=100, eval_interval=50, lr=3e-2)
    cfg.model.n_embd, cfg.model.dropout = 32, 0.0
    trainer = tiny_trainer(cfg, tmp_path / "run")
    summary = trainer.run()
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == list(range(1, 101))
    assert {"step", "loss", "lr", "grad_norm", "tokens_per_sec"} <= set(rows[0])
    assert [r["step"] for r in rows if "val_loss" in r] == [50, 100]
    assert np.mean([r["loss"] for r in rows[-5:]]) < rows[0]["loss"] - 0.5
    assert summary.val_loss == pytest.approx(rows[-1]["val_loss"], abs=1e-6)
    assert math.exp(rows[-1]["val_loss"]) == pytest.approx(rows[-1]["val_perplexity"], rel=1e-4)
    for f in ("model.safetensors", "config.json", "tokenizer.json", "trainer.safetensors",
              "trainer.json"):
        assert (tmp_path / "run" / f).exists()


def test_a_val_loss_past_709_nats_is_logged_without_a_perplexity():
    """e^L past float64's range (L > 709.78) is an infinite perplexity: the line says inf, the
    metrics row leaves it out (JSON has no infinity). It once showed e^50 for every loss
    over 50, a figure that was not the loss's."""
    assert evaluation_record(2.0, 1.5) == {"val_loss": 2.0, "val_perplexity": 7.389056,
                                           "val_bpb": 1.5}
    assert evaluation_record(60.0, None) == {"val_loss": 60.0, "val_perplexity": 1.142007e26}
    assert evaluation_record(800.0, 2.0) == {"val_loss": 800.0, "val_bpb": 2.0}
    line = evaluation_line(10, 20, 800.0, None, True, 800.0, 10, 0)
    assert line == "step 10/20  val loss 800.0000 (perplexity inf), a new best"


def test_resume_matches_an_uninterrupted_run_step_for_step(tmp_path, interrupt_after,
                                                           tiny_config, tiny_trainer,
                                                           read_metrics):
    straight = tiny_trainer(tiny_config(), tmp_path / "a")
    straight.run()
    first = tiny_trainer(tiny_config(), tmp_path / "b")
    interrupt_after(first, 5)
    assert first.run().interrupted
    resumed = tiny_trainer(tiny_config(), tmp_path / "b", resume=True)
    assert resumed.step == 5
    resumed.run()
    a, b = read_metrics(tmp_path / "a"), read_metrics(tmp_path / "b")
    assert [r["step"] for r in b] == list(range(1, 13))
    assert [r["loss"] for r in a] == [r["loss"] for r in b]  # dropout is on: RNG restored too
    assert [r.get("val_loss") for r in a] == [r.get("val_loss") for r in b]


def test_ctrl_c_saves_a_checkpoint_and_stops(tmp_path, interrupt_after, tiny_config,
                                             tiny_trainer):
    trainer = tiny_trainer(tiny_config(steps=50), tmp_path / "run")
    interrupt_after(trainer, 7)
    summary = trainer.run()
    assert summary.interrupted and summary.steps == 7
    state = json.loads((tmp_path / "run" / "trainer.json").read_text())
    assert state["step"] == 7


def test_bf16_autocast_on_cpu_tracks_float32(tmp_path, tiny_config, tiny_trainer, read_metrics):
    results = {}
    for dtype in ("float32", "bfloat16"):
        cfg = tiny_config(steps=30, dtype=dtype, lr=1e-2)
        trainer = tiny_trainer(cfg, tmp_path / dtype)
        assert trainer.engine.description.split(" (")[0].endswith(dtype)
        trainer.run()
        results[dtype] = [r["loss"] for r in read_metrics(tmp_path / dtype)]
    f32, bf16 = np.array(results["float32"]), np.array(results["bfloat16"])
    assert abs(f32[0] - bf16[0]) < 0.02  # same weights and batch: bf16 rounding only
    assert np.abs(f32 - bf16).max() < 0.15 and bf16[-5:].mean() < bf16[0]


def test_float16_on_cpu_is_refused_with_a_clear_message(tiny_config):
    from sheepop.errors import UserError
    with pytest.raises(UserError, match="float16 needs CUDA"):
        TorchEngine(tiny_config().model, TrainConfig(dtype="float16", device="cpu"))
