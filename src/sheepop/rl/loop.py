"""The loop of `sheepop rl`: sample, score, step; log, save, resume.

One step s (train.steps of them):

    lr = lr_for(s)                                    the shared schedule (sheepop.schedule)
    train.batch_size prompts drawn (the run's RNG)    k = rl.group_size answers each, sampled
                                                      by the policy as it is now
    rewards -> advantages                             sheepop.rl.groups
    rl.updates optimizer steps on that batch          engine.logprob_step with the loss of
                                                      sheepop.rl.objective (the first: ratio 1)

The reference (the starting model: the base under LoRA, adapters off; a frozen copy of the
starting weights otherwise) scores every batch, so the KL is logged even when rl.kl = 0 leaves it
out of the loss. Each step appends to metrics.jsonl: reward (mean), signal (the share of groups
whose rewards differ), kl (k3, per answer token), entropy (the answer tokens' mean -log p: a
sample estimate of the policy's entropy), answer_tokens (mean length), clipped, loss, grad_norm;
every train.eval_interval steps, and before the first, `pass@1` on the held-out prompts (greedy).

A checkpoint holds the weights (the adapters under LoRA), the optimizer's moments and RNG
(engine.optimizer_arrays) and the prompts' RNG; the answers' generators are seeded by step
(sheepop.rl.rollouts.row_seeds). A killed run resumed from its checkpoint therefore samples the
same answers and takes the same steps: its weights are those of the uninterrupted run, bit for
bit (tests/finetune/test_rl_run.py). Ctrl-C, SIGTERM and SIGHUP finish the step, save, stop.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sheepop.arch import IGNORE_INDEX
from sheepop.arch.lora import LoraConfig, merge
from sheepop.checkpoint import format as checkpoint
from sheepop.config.schema import Config
from sheepop.errors import UserError
from sheepop.files import open_own_append
from sheepop.inference.load import build
from sheepop.rl.groups import answer_batch, group_advantages, signal_share
from sheepop.rl.objective import Objective, PolicyLoss, policy_objective
from sheepop.rl.rollouts import pass_at_1, row_seeds, sample_answers
from sheepop.rl.run import Task
from sheepop.schedule import lr_for
from sheepop.tokenizers.chat_format import can_chat
from sheepop.train.signals import StopRequest


@dataclass
class RlSummary:
    steps: int
    seconds: float
    pass_before: float | None
    pass_after: float | None
    rewards: list[float] = field(default_factory=list)
    interrupted: bool = False
    signum: int | None = None
    chats: bool = False  # the model answers through a chat template (`sheepop chat` talks to it)

    def lines(self) -> list[str]:
        shown = [f"{self.steps} steps in {self.seconds:.0f} s"]
        if self.rewards:
            shown.append(f"mean reward: {self.rewards[0]:.3f} at the first step of this session"
                         f", {self.rewards[-1]:.3f} at the last")
        if self.pass_after is not None:
            before = "" if self.pass_before is None else f"{self.pass_before:.3f} before, "
            shown.append(f"held-out pass@1 (greedy): {before}{self.pass_after:.3f} after")
        return shown


class RlLoop:
    def __init__(self, cfg: Config, task: Task, engine: Any, tokenizer: Any,
                 base_weights: dict[str, np.ndarray], lora: LoraConfig | None, run_dir: Path,
                 reference: Any, start_step: int = 0, sampler_state: dict | None = None,
                 log=print):
        self.cfg, self.task, self.engine, self.tokenizer = cfg, task, engine, tokenizer
        self.base_weights, self.lora, self.run_dir, self.log = base_weights, lora, run_dir, log
        self.reference = reference  # the frozen starting model (None under LoRA: adapters off)
        self.step = start_step
        self.rng = np.random.default_rng(cfg.train.seed)
        if sampler_state is not None:
            self.rng.bit_generator.state = sampler_state
        r = cfg.rl
        self.loss = PolicyLoss(r.clip, r.kl, r.kl_estimator)
        self.pad = tokenizer.pad_id if tokenizer.pad_id is not None else 0
        self.metrics_path = run_dir / "metrics.jsonl"

    # ----- the model as it is now, for sampling ----------------------------------------------
    def policy(self):
        """An inference model (sheepop.inference.load.build) of the current weights: the
        adapters merged into the base under LoRA."""
        weights = self.engine.weights()
        if self.lora is not None:
            weights = merge(self.base_weights, weights, self.lora)
        weights = {k: np.asarray(v, np.float32) for k, v in weights.items()}
        return build(self.cfg, weights, self.tokenizer, self.cfg.train.engine,
                     device=self.cfg.train.device)

    def reference_logprobs(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        if self.reference is None:
            return self.engine.token_logprobs(x, y, adapters_off=True)
        return self.reference.token_logprobs(x, y)

    def held_out_pass(self, model=None) -> float | None:
        t = self.task
        if not t.held_out:
            return None
        return pass_at_1(model or self.policy(), t.held_out, t.held_out_ids, t.verifier,
                         t.eos_id, t.max_new_tokens)

    # ----- one step --------------------------------------------------------------------------
    def train_step(self) -> dict[str, Any]:
        """Sample, score and update once; the step's metrics."""
        t, r, task = self.cfg.train, self.cfg.rl, self.task
        lr = lr_for(self.step, t)
        picks = self.rng.integers(0, len(task.train), t.batch_size)
        answers = sample_answers(self.policy(), [task.train[i] for i in picks],
                                 [task.train_ids[i] for i in picks], r.group_size,
                                 task.verifier, task.eos_id, task.max_new_tokens,
                                 r.temperature, row_seeds(t.seed, self.step,
                                                          len(picks) * r.group_size))
        advantages = group_advantages(answers.rewards, r.group_size, r.scale_rewards)
        x, y = answer_batch(answers.prompts, answers.tokens, self.pad)
        rows = [c for c in np.array_split(np.arange(len(x)), t.grad_accum) if len(c)]
        batches = [(x[c], y[c]) for c in rows]
        tokens = int((y != IGNORE_INDEX).sum())
        refs = [self.reference_logprobs(bx, by) for bx, by in batches]
        old: list[np.ndarray | None] = [None] * len(batches)
        first: list[Objective] = []
        for update in range(r.updates):
            def loss_of(i: int, logp: np.ndarray, update: int = update) -> tuple[float,
                                                                                  np.ndarray]:
                mask = batches[i][1] != IGNORE_INDEX
                obj = policy_objective(logp, mask, advantages[rows[i]], self.loss, old[i],
                                       refs[i], tokens=tokens)
                if update == 0:  # the sampling policy's log-probabilities, for the ratio
                    old[i] = np.array(logp, np.float64, copy=True)
                    first.append(obj)
                return obj.loss, obj.grad
            loss, norm = self.engine.logprob_step(batches, lr, loss_of)
            if update == 0:
                first_loss, first_norm = loss, norm
        self.step += 1
        return {"step": self.step, "lr": lr, "reward": _num(answers.rewards.mean()),
                "signal": _num(signal_share(answers.rewards, r.group_size)),
                "kl": _num(sum(o.kl for o in first)), "entropy": _num(sum(
                    o.surprisal for o in first)), "clipped": _num(sum(o.clipped for o in first)),
                "answer_tokens": _num(np.mean([len(a) for a in answers.tokens])),
                "loss": _num(first_loss), "grad_norm": _num(first_norm)}

    # ----- the run ---------------------------------------------------------------------------
    def run(self) -> RlSummary:
        t = self.cfg.train
        t0 = time.perf_counter()
        before = after = None
        if self.step == 0 and self.task.held_out:
            before = after = self.held_out_pass()
            self._append({"step": 0, "pass@1": _num(before)})
            self.log(f"step 0: held-out pass@1 {before:.3f}")
        summary = RlSummary(self.step, 0.0, before, after, chats=can_chat(self.tokenizer))
        with StopRequest() as stop:
            while self.step < t.steps:
                record = self.train_step()
                summary.rewards.append(record["reward"])
                last = self.step == t.steps or bool(
                    t.max_minutes and time.perf_counter() - t0 > 60 * t.max_minutes)
                if (t.eval_interval and self.step % t.eval_interval == 0) or last:
                    if self.task.held_out:
                        record["pass@1"] = summary.pass_after = _num(self.held_out_pass())
                self._append(record)
                if self.step % t.log_interval == 0 or last or "pass@1" in record:
                    self.log(_line(record, t.steps))
                if last:
                    break
                if stop.requested:
                    summary.interrupted, summary.signum = True, stop.signum
                    self.log(f"interrupted: saving a checkpoint of step {self.step}")
                    break
                if t.checkpoint_interval and self.step % t.checkpoint_interval == 0:
                    self.save()
            self.save()
        summary.steps, summary.seconds = self.step, time.perf_counter() - t0
        return summary

    def save(self) -> None:
        arrays, info = self.engine.optimizer_arrays()
        state = {"step": self.step, "engine": self.engine.name, "optimizer":
                 self.cfg.train.optimizer, "sampler": self.rng.bit_generator.state, **info}
        weights = {k: np.array(v, copy=True) for k, v in self.engine.weights().items()}
        if not all(np.isfinite(w).all() for w in weights.values()):
            raise UserError(f"step {self.step}: the weights are no longer finite numbers: "
                            f"lower train.lr (the checkpoint in {self.run_dir} is kept)")
        try:
            checkpoint.save_checkpoint(self.run_dir, weights, self.cfg.to_dict(),
                                       self.tokenizer.to_json(), arrays, state)
        except checkpoint.SaveFailed as e:
            raise UserError(f"saving the checkpoint of step {self.step} in {self.run_dir} "
                            f"failed: {e.reason}") from None

    def _append(self, record: dict[str, Any]) -> None:
        with open_own_append(self.metrics_path) as f:
            f.write(json.dumps(record) + "\n")


def _num(x: float) -> float | None:
    """x to 7 significant digits; None (JSON null) for NaN."""
    x = float(x)
    return float(f"{x:.7g}") if math.isfinite(x) else None


def _line(record: dict[str, Any], steps: int) -> str:
    parts = [f"step {record['step']}/{steps}: reward {record['reward']:.3f}, signal "
             f"{record['signal']:.2f}, kl {record['kl']:.4f}, entropy {record['entropy']:.3f}, "
             f"answer {record['answer_tokens']:.1f} tokens"]
    if "pass@1" in record:
        parts.append(f"held-out pass@1 {record['pass@1']:.3f}")
    return "; ".join(parts)
