"""`sheepop rl` end to end on a tiny model (tests/helpers/tiny_run.py): the mean reward rises, a
killed run resumes to the same weights bit for bit, the KL is measured against the starting
model (not one that moves with the policy), both engines take the same policy-gradient steps on
the same batch, and mistakes are one line with exit status 2."""

from __future__ import annotations

import dataclasses
import json
import sys

import numpy as np
import pytest
import torch
from cli_refusal import fails
from float_tolerance import model_depth
from tiny_run import train_tiny_run

from sheepop.checkpoint import format as checkpoint
from sheepop.config.schema import ModelConfig, TrainConfig
from sheepop.rl.groups import answer_batch
from sheepop.rl.loop import RlLoop
from sheepop.rl.objective import PolicyLoss, policy_objective
from sheepop.rl.start import reinforce
from sheepop.scratch.init import init_params
from sheepop.train.engine_numpy import NumpyEngine
from sheepop.train.engine_torch import TorchEngine

pytestmark = pytest.mark.usefixtures("one_torch_thread")

WORDS = ["the ", "quick ", "brown ", "fox ", "lazy ", "dog "]
# The reward: the share of the letter o in the answer; dense, so a few steps move it.
REWARD = "def share_of_o(answer, record):\n    return answer.count('o') / max(len(answer), 1)\n"
SETTINGS = ["rl.max_new_tokens=6", "train.lr=0.01", "rl.eval_prompts=2", "train.eval_interval=3",
            "train.threads=1", "rl.group_size=4", "train.batch_size=4"]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    root = tmp_path_factory.mktemp("rl")
    train_tiny_run(root, 16)
    (root / "prompts.jsonl").write_text("".join(
        json.dumps({"prompt": w, "answer": "o"}) + "\n" for w in WORDS))
    (root / "o_rewards.py").write_text(REWARD)
    return root


@pytest.fixture
def verifier_module(base, monkeypatch):
    monkeypatch.chdir(base)
    monkeypatch.setitem(sys.modules, "o_rewards", None)  # imported afresh from the cwd
    monkeypatch.delitem(sys.modules, "o_rewards")
    return "o_rewards:share_of_o"


def rl(base, out, verifier, *settings, resume=False):
    overrides = ["train.threads=1"] if resume else [f"rl.verifier={verifier}", *SETTINGS,
                                                    *settings]
    return reinforce(None if resume else str(base / "run"), str(base / "prompts.jsonl"),
                     base / out, overrides=overrides, resume=resume, log=lambda *_: None)


def metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_the_mean_reward_rises(base, verifier_module):
    summary = rl(base, "rises", verifier_module, "train.steps=24")
    rewards = [row["reward"] for row in metrics(base / "rises") if "reward" in row]
    assert len(rewards) == 24 and summary.steps == 24
    # the untrained model writes o about once in 25 letters; RL makes it several times that
    assert np.mean(rewards[:4]) < 0.08 and np.mean(rewards[-4:]) > 3 * np.mean(rewards[:4])
    rows = metrics(base / "rises")
    assert rows[0] == {"step": 0, "pass@1": 0.0}  # greedy "the quick..." holds no all-o answer
    for key in ("signal", "kl", "entropy", "answer_tokens", "clipped", "loss", "grad_norm"):
        assert all(np.isfinite(row[key]) for row in rows[1:]), key
    assert [row["step"] for row in rows if "pass@1" in row] == [0, 3, 6, 9, 12, 15, 18, 21, 24]


VARIANTS = {"torch-full": ["train.engine=torch"],
            "numpy-lora": ["train.engine=numpy", "lora.rank=2", "lora.targets=qkv,fc",
                           "train.lr=0.05"]}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_killed_run_resumes_to_the_same_weights(base, verifier_module, variant, monkeypatch):
    """Two updates a batch (the clipped ratio at work) and a KL term; killed during step 5, the
    run resumes from its checkpoint of step 3 and ends where the uninterrupted one did."""
    settings = [*VARIANTS[variant], "rl.kl=0.1", "rl.updates=2", "train.steps=6",
                "train.checkpoint_interval=3", "train.eval_interval=0"]
    rl(base, f"whole-{variant}", verifier_module, *settings)
    step = RlLoop.train_step

    def killed(loop):
        if loop.step == 4:
            raise KeyboardInterrupt  # the process dies: nothing saves
        return step(loop)
    monkeypatch.setattr(RlLoop, "train_step", killed)
    with pytest.raises(KeyboardInterrupt):
        rl(base, f"killed-{variant}", verifier_module, *settings)
    assert checkpoint.load_trainer_state(base / f"killed-{variant}")[1]["step"] == 3
    monkeypatch.setattr(RlLoop, "train_step", step)
    rl(base, f"killed-{variant}", verifier_module, resume=True)
    whole = checkpoint.load_weights(base / f"whole-{variant}")
    resumed = checkpoint.load_weights(base / f"killed-{variant}")
    assert whole.keys() == resumed.keys()
    for name in whole:
        np.testing.assert_array_equal(resumed[name], whole[name], err_msg=name)
    assert metrics(base / f"killed-{variant}") == metrics(base / f"whole-{variant}")
    kl = [row["kl"] for row in metrics(base / f"whole-{variant}") if "kl" in row]
    # The reference is the starting model: the policy's first samples are its own (KL 0), and
    # the KL grows as the policy moves (a reference that moved with it would stay at 0).
    assert kl[0] < 1e-9 and kl[-1] > 1e-4, kl


CFG = ModelConfig(vocab_size=11, block_size=12, n_layer=2, n_head=2, n_embd=16)


def test_both_engines_take_the_same_policy_gradient_steps():
    """The clipped, KL-regularised loss of one batch of answers, two updates, in float64: the
    engines see the same log-probabilities and report the same loss and gradient norm."""
    rng = np.random.default_rng(0)
    weights = init_params(CFG, 0, np.float64)
    for v in weights.values():
        v += rng.standard_normal(v.shape) * 0.1
    tcfg = TrainConfig(lr=3e-2, weight_decay=0.0, grad_clip=0.0, device="cpu", seed=1)
    ours = NumpyEngine(CFG, dataclasses.replace(tcfg, dtype="float64"), weights)
    theirs = TorchEngine(CFG, dataclasses.replace(tcfg, dtype="float32"), weights)
    theirs.model.double()
    with torch.no_grad():
        for name, p in theirs.model.named_parameters():
            p.copy_(torch.from_numpy(weights[name]))
    prompts = [[1, 2, 3], [1, 2, 3], [4, 5], [4, 5]]
    answers = [[6, 7, 8, 9], [6, 0], [7, 7, 7], [3]]
    x, y = answer_batch(prompts, answers, pad_id=0)
    advantages = np.array([0.5, -0.5, 1.0, -1.0])
    ref = ours.token_logprobs(x, y) + rng.normal(0, 0.3, x.shape) * (y >= 0)
    seen = {}
    for engine in (ours, theirs):
        old = None
        for update in range(3):
            def loss_of(i, logp, engine=engine, update=update):
                nonlocal old
                seen[engine.name, update] = logp.copy()
                obj = policy_objective(logp, y >= 0, advantages, PolicyLoss(0.2, 0.5), old, ref)
                if update == 0:
                    old = logp.copy()
                return obj.loss, obj.grad
            seen[engine.name, update, "step"] = engine.logprob_step([(x, y)], 3e-2, loss_of)
    # (the torch engine's sinusoidal table is made in float32: each input off by up to u =
    # 2^-24 relative, carried through the model's 2 * 8 + 2 steps: 18 u ~ 1e-6)
    for update in range(3):
        np.testing.assert_allclose(seen["numpy", update], seen["torch", update],
                                   rtol=model_depth(CFG.n_layer) * 2.0**-24)
        np.testing.assert_allclose(seen["numpy", update, "step"], seen["torch", update, "step"],
                                   rtol=1e-6)
    assert not np.allclose(seen["numpy", 2], seen["numpy", 0])  # the updates moved the policy


@pytest.mark.parametrize("argv, message", [
    (["--verifier", "no_module_here:f"], "verifier 'no_module_here:f': cannot import"),
    (["--group-size", "1"], "rl.group_size must be at least 2"),
    (["--set", "rl.clip=1.5"], "rl.clip must be in (0, 1)"),
    (["--task", "progression"], "is not a progression run"),
    (["--set", "rl.max_new_tokens=40"], "leaves no room for an answer of 40"),
])
def test_mistakes_are_one_line(base, capsys, argv, message):
    prompts = [] if "--task" in argv else ["--prompts", str(base / "prompts.jsonl")]
    fails(capsys, ["rl", str(base / "run"), *prompts, "--out", str(base / "refused"),
                   "--threads", "1", *argv], message)
    assert not (base / "refused" / "model.safetensors").exists()


def test_help_config_shows_what_a_run_of_the_base_would_use(base, capsys):
    from sheepop.cli import main
    assert main(["rl", str(base / "run"), "--help-config", "--lora-rank", "4", "--kl", "0.05"]) == 0
    out = capsys.readouterr().out
    for line in ("model.block_size = 16", "train.lr = 0.0005", "train.weight_decay = 0.0",
                 "lora.rank = 4", "rl.kl = 0.05", "rl.group_size = 8", "rl.kl_estimator = 'k3'"):
        assert f"\n  {line}" in out, line
