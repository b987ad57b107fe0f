"""Starting `sheepop rl` (fresh or resumed) and running it: the run directory's lock, the
engine on the base run's weights (or a checkpoint's), the reference, and the loop
(sheepop.rl.loop). A resumed run reads its own rl.json: the prompts, the verifier and every
[rl] setting are the run's; train.* and sample.* may change."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from sheepop.checkpoint import format as checkpoint
from sheepop.errors import UserError
from sheepop.rl.loop import RlLoop, RlSummary
from sheepop.rl.run import build_task, start
from sheepop.train import run_lock
from sheepop.train.start import _truncate_metrics, make_engine


def reinforce(base_run: str | None, prompts: str | None, run_dir: str | Path,
              overrides: list[str] | None = None, values: dict[str, Any] | None = None,
              resume: bool = False, config_file: str | Path | None = None,
              log=print) -> RlSummary:
    """Train `base_run` by RL on `prompts` (or the built-in rl.task) into `run_dir`, or
    continue it with `resume`; the summary."""
    run_dir = Path(run_dir)
    cfg, opts, tokenizer, weights, lora = start(base_run, prompts, run_dir, overrides, values,
                                                resume, config_file)
    task = build_task(cfg, cfg.rl, opts.prompts, opts.base_run, tokenizer)
    for line in task.report:
        log(line)
    lock = run_lock.acquire(run_dir)
    try:
        checkpoint.recover(run_dir)
        loop = _loop(cfg, opts, task, tokenizer, weights, lora, run_dir, resume, log)
        return loop.run()
    finally:
        lock.release()


def _loop(cfg, opts, task, tokenizer, weights, lora, run_dir: Path, resume: bool, log
          ) -> RlLoop:
    """The loop at step 0 on the base weights, or at the checkpoint's step with its state."""
    start_step, sampler_state, arrays, state, saved = 0, None, None, None, None
    if resume:
        if not checkpoint.holds_checkpoint(run_dir):
            raise UserError(f"--resume: no checkpoint in {run_dir}")
        saved = checkpoint.load_weights(run_dir)
        arrays, state = checkpoint.load_trainer_state(run_dir)
        start_step, sampler_state = int(state["step"]), state.get("sampler")
        if start_step >= cfg.train.steps:
            raise UserError(f"the run is already at step {start_step} of train.steps="
                            f"{cfg.train.steps}: give a larger --steps to continue it")
    elif checkpoint.holds_checkpoint(run_dir):
        raise UserError(f"{run_dir} already holds a run: continue it with --resume or choose "
                        "another --out")
    policy_weights = weights if lora is not None or saved is None else saved
    # The gradient is that of the policy that sampled, the model as it generates: a training
    # step's noise (dropout, the digit places' random offsets) would make the loss's
    # log-probabilities another model's (the first step's KL to the very same weights was 1.5
    # nats a token on a progression model). Both are for training only: the run's config keeps
    # them.
    quiet = copy.deepcopy(cfg)
    quiet.model.dropout, quiet.model.digit_offset = 0.0, 0
    engine = make_engine(quiet, policy_weights, lora, saved if lora is not None else None)
    # The reference is the starting model: under LoRA the base (the adapters switched off),
    # otherwise a frozen engine on the base run's weights.
    reference = None if lora is not None else make_engine(quiet, weights)
    if resume:
        engine.load_optimizer_arrays(arrays, state)
        log(f"resuming {run_dir} at step {start_step}")
    run_dir.mkdir(parents=True, exist_ok=True)
    _truncate_metrics(run_dir / "metrics.jsonl", start_step)
    opts.save(run_dir)
    if lora is not None:
        lora.save(run_dir)  # before the first checkpoint: the adapters are nothing without it
    log(f"base: {opts.base_run}; {engine.description}"
        + ("" if lora is None else f"; LoRA rank {lora.rank} on {', '.join(lora.targets)}"))
    return RlLoop(cfg, task, engine, tokenizer, weights, lora, run_dir, reference, start_step,
                  sampler_state, log)
