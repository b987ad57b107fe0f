"""The NumPy engine in use: the shared training loop, resume, generation with its KV cache, the
command line, and memory that does not grow over a run."""

from __future__ import annotations

import json
import tracemalloc

import numpy as np
import pytest
from variants import llama

from sheepop.cli import main
from sheepop.config.schema import ModelConfig, SampleConfig, TrainConfig
from sheepop.generation.generate import generate, generate_batch_ids
from sheepop.model import GPT as TorchGPT
from sheepop.model import TorchLM
from sheepop.scratch.gpt import GPT, gpt_forward, new_cache
from sheepop.scratch.lm import NumpyLM
from sheepop.train.engine_numpy import NumpyEngine

# The tiny run (tiny_config, tiny_trainer, read_metrics, tiny_text) is in tests/conftest.py: the
# torch engine's tests in tests/train/ train the same one.


def test_the_shared_loop_trains_the_numpy_engine(tmp_path, tiny_config, tiny_trainer,
                                                 read_metrics):
    cfg = tiny_config("numpy", steps=40, eval_interval=20, lr=1e-2)
    trainer = tiny_trainer(cfg, tmp_path / "run")
    assert trainer.engine.name == "numpy"
    summary = trainer.run()
    r = read_metrics(tmp_path / "run")
    assert [x["step"] for x in r] == list(range(1, 41))
    assert np.mean([x["loss"] for x in r[-5:]]) < r[0]["loss"] - 0.3
    assert summary.val_loss == pytest.approx(r[-1]["val_loss"], abs=1e-6)
    state = json.loads((tmp_path / "run" / "trainer.json").read_text())
    assert state["engine"] == "numpy" and state["adam_step"] == 40


def test_resume_matches_an_uninterrupted_run_with_dropout(tmp_path, interrupt_after, tiny_config,
                                                         tiny_trainer, read_metrics):
    tiny_trainer(tiny_config("numpy"), tmp_path / "a").run()
    first = tiny_trainer(tiny_config("numpy"), tmp_path / "b")
    interrupt_after(first, 5)
    assert first.run().interrupted
    resumed = tiny_trainer(tiny_config("numpy"), tmp_path / "b", resume=True)
    assert resumed.step == 5
    resumed.run()
    a, b = read_metrics(tmp_path / "a"), read_metrics(tmp_path / "b")
    assert [x["loss"] for x in a] == [x["loss"] for x in b]  # the dropout RNG is restored too


def test_a_torch_run_resumes_in_the_numpy_engine(tmp_path, interrupt_after, tiny_config,
                                                 tiny_trainer, read_metrics):
    tiny_trainer(tiny_config("torch", dropout=0.0), tmp_path / "torch").run()
    first = tiny_trainer(tiny_config("torch", dropout=0.0), tmp_path / "mixed")
    interrupt_after(first, 5)
    first.run()
    tiny_trainer(tiny_config("numpy", dropout=0.0), tmp_path / "mixed", resume=True).run()
    a, b = read_metrics(tmp_path / "torch"), read_metrics(tmp_path / "mixed")
    assert [x["step"] for x in b] == list(range(1, 13))
    np.testing.assert_allclose([x["loss"] for x in b], [x["loss"] for x in a], atol=2e-5)


@pytest.mark.parametrize("model", [{}, llama(n_kv_head=1)])
def test_a_numpy_run_resumes_in_the_torch_engine(tmp_path, interrupt_after, tiny_config,
                                                 tiny_trainer, read_metrics, model):
    def cfg(engine):
        c = tiny_config(engine, dropout=0.0)
        for k, v in model.items():
            c.set(f"model.{k}", v)
        return c
    tiny_trainer(cfg("numpy"), tmp_path / "numpy").run()
    first = tiny_trainer(cfg("numpy"), tmp_path / "mixed")
    interrupt_after(first, 5)
    first.run()
    tiny_trainer(cfg("torch"), tmp_path / "mixed", resume=True).run()
    a, b = read_metrics(tmp_path / "numpy"), read_metrics(tmp_path / "mixed")
    assert [x["step"] for x in b] == list(range(1, 13))
    np.testing.assert_allclose([x["loss"] for x in b], [x["loss"] for x in a], atol=2e-5)


def model_pair(**kw):
    cfg = ModelConfig(vocab_size=13, block_size=10, n_layer=2, n_head=2, n_embd=16, **kw)
    weights = GPT(cfg, seed=4).numpy_weights()
    rng = np.random.default_rng(0)
    for v in weights.values():
        v += rng.standard_normal(v.shape).astype(np.float32) * 0.3
    return cfg, weights


@pytest.mark.parametrize("kw", [{}, {"pos_encoding": "learned", "tie_weights": False},
                                llama(n_kv_head=2)])
def test_kv_cache_gives_the_logits_of_a_full_forward(kw):
    cfg, weights = model_pair(**kw)
    params = GPT(cfg, weights, np.float64).params
    ids = np.random.default_rng(1).integers(0, 13, (2, 9))
    full = gpt_forward(params, cfg, ids)[0]
    cache = new_cache(cfg, batch=2, dtype=np.float64)
    prompt = gpt_forward(params, cfg, ids[:, :4], cache=cache)[0]
    steps = [gpt_forward(params, cfg, ids[:, t:t + 1], cache=cache, last_only=True)[0][:, 0]
             for t in range(4, 9)]
    np.testing.assert_allclose(prompt, full[:, :4], rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.stack(steps, 1), full[:, 4:], rtol=0, atol=1e-12)
    assert cache.length == 9


@pytest.mark.parametrize("kw", [{}, llama(n_kv_head=1)])
def test_generation_matches_the_torch_engine_past_the_context(kw):
    cfg, weights = model_pair(**kw)
    torch_model = TorchGPT(cfg)
    torch_model.load_numpy_weights(weights)
    ours, theirs = NumpyLM(cfg, weights), TorchLM(torch_model)
    prompt = [1, 2, 3]
    np.testing.assert_allclose(ours.prefill(prompt), theirs.prefill(prompt), atol=1e-5)
    greedy = SampleConfig(max_new_tokens=25, temperature=0.0)  # slides past block_size 10
    a = [s.token for s in generate(ours, prompt, greedy)]
    b = [s.token for s in generate(theirs, prompt, greedy)]
    c = [s.token for s in generate(ours, prompt, greedy, use_cache=False)]
    assert a == b == c and len(a) == 25


@pytest.mark.parametrize("kw", [{}, {"pos_encoding": "learned"}, llama(n_kv_head=1)])
def test_batched_generation_with_left_padding_matches_torch_and_single_prompts(kw):
    cfg, weights = model_pair(**kw)
    torch_model = TorchGPT(cfg)
    torch_model.load_numpy_weights(weights)
    ours, theirs = NumpyLM(cfg, weights, np.float64), TorchLM(torch_model)
    prompts = [[1, 2, 3, 4, 5], [6], [7, 8, 9]]
    first = ours.prefill_batch(prompts)
    np.testing.assert_allclose(first, theirs.prefill_batch(prompts), atol=1e-5)
    np.testing.assert_allclose(ours.full_batch(prompts), first, atol=1e-12)
    for row, prompt in zip(first, prompts):  # padding changes nothing for any row
        np.testing.assert_allclose(row, ours.full(prompt), atol=1e-12)
    greedy = SampleConfig(max_new_tokens=12, temperature=0.0)  # runs past block_size 10
    batch = generate_batch_ids(ours, prompts, greedy, eos_id=3)
    assert len({len(out) for out in batch}) > 1  # rows end at different steps (keep_rows)
    assert batch == generate_batch_ids(theirs, prompts, greedy, eos_id=3)
    assert batch == generate_batch_ids(ours, prompts, greedy, use_cache=False, eos_id=3)
    for out, prompt in zip(batch, prompts):
        assert out == [s.token for s in generate(ours, prompt, greedy, eos_id=3)]


def test_command_line_trains_and_generates_with_the_numpy_engine(tmp_path, capsys, tiny_text):
    data = tmp_path / "text.txt"
    data.write_text(tiny_text)
    run = tmp_path / "run"
    sets = ["model.n_layer=1", "model.n_embd=16", "model.n_head=2", "model.block_size=16",
            "train.batch_size=4", "train.eval_batches=1", "train.warmup_steps=2"]
    args = ["train", str(data), "--out", str(run), "--engine", "numpy", "--steps", "6",
            "--no-progress"]
    assert main(args + [a for s in sets for a in ("--set", s)]) == 0
    assert "numpy" in capsys.readouterr().out
    assert json.loads((run / "trainer.json").read_text())["engine"] == "numpy"
    assert main(["generate", str(run), "--prompt", "the ", "--engine", "numpy",
                 "--max-new-tokens", "12", "--seed", "3"]) == 0
    ours = capsys.readouterr().out
    assert main(["generate", str(run), "--prompt", "the ", "--engine", "torch",
                 "--max-new-tokens", "12", "--seed", "3", "--device", "cpu"]) == 0
    assert ours.startswith("the ") and ours == capsys.readouterr().out


def test_memory_does_not_grow_over_steps():
    cfg = ModelConfig(vocab_size=20, block_size=16, n_layer=2, n_head=2, n_embd=32, dropout=0.1)
    engine = NumpyEngine(cfg, TrainConfig(lr=1e-3))
    rng = np.random.default_rng(0)
    batches = [(rng.integers(0, 20, (4, 16)), rng.integers(0, 20, (4, 16))) for _ in range(2)]
    engine.train_step(batches, 1e-3)  # first step: moments and buffers come into being
    tracemalloc.start()
    sizes = []
    for _ in range(4):
        engine.train_step(batches, 1e-3)
        sizes.append(tracemalloc.get_traced_memory()[0])
    tracemalloc.stop()
    assert max(sizes) - min(sizes) < 4096, sizes  # nothing kept from step to step


def test_torch_only_dtypes_fall_back_to_float32_and_say_so():
    cfg = ModelConfig(vocab_size=5, block_size=4, n_layer=1, n_head=1, n_embd=4)
    engine = NumpyEngine(cfg, TrainConfig(dtype="bfloat16"))
    assert engine.model.params["tok_emb.weight"].dtype == np.float32
    assert "bfloat16 is torch-only" in engine.description
    assert NumpyEngine(cfg, TrainConfig(dtype="float64")).model.dtype == np.float64


def test_the_scratch_package_never_imports_torch():
    import subprocess
    import sys
    code = ("import sys, sheepop.scratch, sheepop.train.engine_numpy; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
