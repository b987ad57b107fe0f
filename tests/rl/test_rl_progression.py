"""`sheepop rl --task progression` on a model trained by `sheepop progression train` (digits
written least significant first): the RL path (the prompt's text through the digits tokenizer,
the batched generator, the progression verifier reading the terms backwards) scores the
held-out prompts exactly as the progression task's own greedy decoding does, the loss sees
the policy that sampled (the preset's training-time digit offsets off), and the policy-gradient
step raises the verifier's reward on a toy small enough to learn in seconds."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sheepop.config.build import build_config
from sheepop.inference.load import load
from sheepop.progression.data import load_progressions, write_dataset
from sheepop.progression.spec import Spec
from sheepop.progression.stream import digits_value
from sheepop.progression.task import TaskOptions, train
from sheepop.rl import tasks
from sheepop.rl.start import reinforce

pytestmark = pytest.mark.usefixtures("one_torch_thread")
HELD_OUT = 60


@pytest.fixture(scope="module")
def progression_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("rl-progression")
    write_dataset(root / "data", Spec(count=600, first_max=99, max_difference=20, min_terms=6,
                                      max_terms=20, ood_count=20, seed=1))
    data = load_progressions(root / "data")
    cfg = build_config("progression", None, [
        "model.n_layer=2", "model.n_embd=32", "train.steps=300", "train.batch_size=32",
        "train.lr=1e-2", "train.min_lr=1e-3", "train.warmup_steps=10", "train.eval_interval=0",
        "train.checkpoint_interval=0", "train.threads=1"])
    opts = TaskOptions(data.digits, window_terms=4, reverse_digits=True, data=str(root / "data"))
    train(data, cfg, opts, root / "run", progress=False, log=lambda *_: None)
    return root


def test_pass_at_1_is_the_progression_tasks_own_greedy_accuracy(progression_run):
    root = progression_run
    reinforce(str(root / "run"), None, root / "rl", overrides=[
        "rl.task=progression", f"rl.eval_prompts={HELD_OUT}", "rl.group_size=4",
        "train.batch_size=4", "train.steps=2", "train.eval_interval=0", "train.threads=1"],
        log=lambda *_: None)
    rows = [json.loads(line) for line in (root / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["step"] == 0 and len(rows) == 3
    # the same held-out prompts, decoded by the progression task's batched greedy loop
    opts = TaskOptions.load(root / "run")
    items = tasks.progression_items(opts.digits, opts.window_terms - 1, 1, seed=1337,
                                    reverse=True)
    _, held, apart = tasks.split(items, HELD_OUT, seed=1337)
    assert apart and held[0]["prompt"].count(" ") == 3
    model = load(root / "run", "torch")
    contexts = np.array([model.tokenizer.encode(r["prompt"]) for r in held])
    written = digits_value(model.lm.greedy(contexts, opts.digits), reverse=True)
    right = int(np.sum(written == np.array([r["answer"][0] for r in held])))
    assert 0 < right < HELD_OUT  # partly trained: a test that tells right from wrong
    assert round(rows[0]["pass@1"] * HELD_OUT, 3) == right  # (logged to 7 digits)
    assert all(0 <= row["reward"] <= 1 for row in rows[1:])
    # the loss's log-probabilities are the sampling policy's: no training-time digit offsets
    # (this model's preset draws them), so the first step's KL to the same weights is 0
    assert rows[1]["kl"] < 1e-9


@pytest.fixture(scope="module")
def one_digit_run(tmp_path_factory):
    """A 1-layer, 16-wide progression model of 1-digit terms, trained 60 steps: the task's
    prompts are then "a a+1 a+2 " (d = 9 // (2 x 4) = 1, a = 0..6) -> a + 3, and its greedy
    answer is right on about a quarter of them."""
    root = tmp_path_factory.mktemp("rl-progression-one-digit")
    write_dataset(root / "data", Spec(count=4, first_max=4, max_difference=1, min_terms=4,
                                      max_terms=5, digits=1, ood_count=0, seed=1))
    data = load_progressions(root / "data")
    cfg = build_config("progression", None, [
        "model.n_layer=1", "model.n_embd=16", "train.steps=60", "train.batch_size=8",
        "train.warmup_steps=0", "train.eval_interval=0", "train.checkpoint_interval=0",
        "train.threads=1"])
    opts = TaskOptions(data.digits, window_terms=4, reverse_digits=True, data=str(root / "data"))
    train(data, cfg, opts, root / "run", progress=False, log=lambda *_: None)
    return root


def test_the_policy_gradient_raises_the_progression_reward(one_digit_run):
    """40 steps of 32 prompts x 8 answers at a constant rate of 1e-2: the mean reward (the
    share of sampled next terms right) from about 0.15 to about 0.8 here, and the held-out
    greedy pass@1 with it. Without the step (train.lr 1e-9, or the advantages zeroed) the
    reward stays where it started."""
    root = one_digit_run
    summary = reinforce(str(root / "run"), None, root / "rl", overrides=[
        "rl.task=progression", "rl.eval_prompts=20", "train.steps=40", "train.batch_size=32",
        "train.lr=1e-2", "train.min_lr=1e-2", "train.eval_interval=0", "train.threads=1"],
        log=lambda *_: None)
    rows = [json.loads(line) for line in (root / "rl" / "metrics.jsonl").read_text().splitlines()]
    rewards = [row["reward"] for row in rows if "reward" in row]
    first, last = np.mean(rewards[:5]), np.mean(rewards[-5:])
    # 1,280 answers in each mean: a standard error of about 0.01 at these rewards
    assert first < 0.3 and last > 0.5 and last > 2 * first, rewards
    assert summary.pass_after > summary.pass_before, (summary.pass_before, summary.pass_after)
