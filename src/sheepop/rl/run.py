"""`sheepop rl`: reinforcement learning with verifiable rewards on a trained run, in full or
with LoRA adapters, in either engine (docs/finetune.md, "Reinforcement learning";
docs/derivations/policy-gradient.md).

    base run (any: sheepop's, a fine-tune, an imported SmolLM2) -> the policy and the reference
    prompts (JSON Lines, or a built-in task) -> training and held-out records, their ids
    each step (sheepop.rl.loop): k answers a prompt -> verifier -> advantages -> the clipped,
    token-level policy-gradient loss through the engine's log-probabilities

What belongs to the run lives in its `rl.json`:

    {"format": "sheepop-rl-run", "version": 1, "base_run": "/abs/path", "prompts": "/abs/path"
     or "", "rl": {the [rl] settings}, "lora": null | {"rank": r, ...}}

Like a fine-tune, a full run is a plain run afterwards, and a LoRA run saves its adapters and
lora.json, read back onto the base run by sheepop.inference.load (the base must stay where it
was). Nothing is added to the tokenizer: a model that can chat answers through its template,
any other continues the prompt's text (sheepop.rl.tasks).
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from sheepop.arch.lora import LoraConfig
from sheepop.checkpoint import format as checkpoint
from sheepop.config.build import build_config
from sheepop.config.rl import RlConfig
from sheepop.config.schema import Config
from sheepop.errors import UserError
from sheepop.files import DocumentFormat, read_fields, write_document
from sheepop.inference.load import read_run
from sheepop.rl import tasks
from sheepop.rl.verifiers import resolve
from sheepop.tokenizers.chat_format import can_chat, turn_end

RUN_FILE = "rl.json"
RUN_DOCUMENT = DocumentFormat("sheepop-rl-run", 1, "sheepop RL run file")
NEW_SECTIONS = ("train", "sample", "lora", "rl")  # what a new run's settings set
RESUME_SECTIONS = ("train", "sample")  # and a resumed one's: the rest is the run's
# RL moves a trained model a little on its own samples: no warmup, no weight decay pulling the
# weights (or under LoRA the update) anywhere, a gentler rate than supervised fine-tuning's, and a
# step is a whole round of sampling, so fewer of them (docs/finetune.md says why each).
TRAIN_DEFAULTS: dict[str, Any] = {"steps": 50, "batch_size": 8, "warmup_steps": 0,
                                  "weight_decay": 0.0, "decay_steps": 0, "max_minutes": 0.0,
                                  "eval_interval": 10, "checkpoint_interval": 10}
LR = {"full": (5e-5, 5e-6), "lora": (5e-4, 5e-5)}  # (train.lr, train.min_lr)
DEFAULT_VERIFIER = {"file": "exact", "addition": "integer", "progression": "progression"}


@dataclass
class RlOptions:
    base_run: str
    prompts: str
    rl: dict[str, Any]
    lora: dict[str, Any] | None = None

    def settings(self) -> RlConfig:
        known = {f.name for f in fields(RlConfig)}
        return RlConfig(**{k: v for k, v in self.rl.items() if k in known})

    def lora_config(self) -> LoraConfig | None:
        return None if self.lora is None else LoraConfig.from_dict(self.lora, self.base_run)

    def save(self, run_dir: str | Path) -> None:
        write_document(Path(run_dir) / RUN_FILE, RUN_DOCUMENT, asdict(self))

    @classmethod
    def load(cls, run_dir: str | Path) -> RlOptions:
        return read_fields(
            Path(run_dir) / RUN_FILE, RUN_DOCUMENT, f"{run_dir} is not an RL run (no "
            f"{RUN_FILE}): start it with `sheepop rl BASE_RUN`",
            lambda d: cls(str(d["base_run"]), str(d["prompts"]), dict(d["rl"]), d.get("lora")))


@dataclass
class Task:
    """The prompts of a run, encoded, and how their answers are read."""
    train: list[tasks.Record]
    held_out: list[tasks.Record]
    train_ids: list[list[int]]
    held_out_ids: list[list[int]]
    verifier: Any
    eos_id: int | None
    max_new_tokens: int
    report: list[str]


def settings(base_cfg: Config, config_file: str | Path | None, overrides: list[str] | None,
             values: dict[str, Any]) -> Config:
    """A new run's config: the base run's model and sample settings, this command's train
    defaults (LoRA's rate or a full run's: the settings are read once to know which), then the
    file, `--set` and the flags."""
    def build(kind: str) -> Config:
        base = copy.deepcopy(base_cfg)
        lr, min_lr = LR[kind]
        for key, value in {**TRAIN_DEFAULTS, "lr": lr, "min_lr": min_lr}.items():
            base.set(f"train.{key}", value, "rl defaults")
        return build_config(None, config_file, overrides, base=base, values=values,
                            only=NEW_SECTIONS)
    cfg = build("full")
    return build("lora") if cfg.lora.rank else cfg


def build_task(cfg: Config, rl: RlConfig, prompts: str, base_run: str, tokenizer: Any
               ) -> Task:
    """The prompts of the task (`prompts` for rl.task=file), split and encoded, and the
    verifier; a prompt that leaves no room for an answer in the context is refused."""
    verifier = resolve(rl.verifier or DEFAULT_VERIFIER[rl.task])
    max_new = rl.max_new_tokens
    if rl.task == "file":
        if not prompts:
            raise UserError("sheepop rl needs --prompts FILE (JSON Lines) or a built-in --task")
        items = tasks.read_prompts(prompts)
    elif rl.task == "addition":
        items = tasks.addition_items(rl.digits)
    else:
        from sheepop.progression.task import TaskOptions
        opts = TaskOptions.load(base_run)
        items = tasks.progression_items(opts.digits, opts.window_terms - rl.answer_terms,
                                        rl.answer_terms, cfg.train.seed, opts.reverse_digits)
        max_new = rl.answer_terms * (opts.digits + 1) - 1  # the terms and the spaces between
    train, held_out, apart = tasks.split(items, rl.eval_prompts, cfg.train.seed)
    eos_id = turn_end(tokenizer).eos_id if can_chat(tokenizer) else tokenizer.eos_id
    train_ids = [tasks.prompt_ids(tokenizer, r) for r in train]
    held_out_ids = [tasks.prompt_ids(tokenizer, r) for r in held_out]
    room = cfg.model.block_size + 1 - max_new  # a row is prompt + answer less one token
    for ids in train_ids + held_out_ids:
        if len(ids) > room:
            raise UserError(f"a prompt of {len(ids)} tokens leaves no room for an answer of "
                            f"{max_new} (rl.max_new_tokens) in the context of "
                            f"{cfg.model.block_size}")
    where = prompts if rl.task == "file" else f"the {rl.task} task"
    report = [f"prompts: {where}: {len(train):,} to train on, {len(held_out):,} held out"
              + ("" if apart else " (drawn from the same prompts: the set is small)"),
              f"verifier: {rl.verifier or DEFAULT_VERIFIER[rl.task]}; {rl.group_size} answers "
              f"a prompt, {cfg.train.batch_size} prompts a step, answers of at most {max_new} "
              f"tokens"]
    return Task(train, held_out, train_ids, held_out_ids, verifier, eos_id, max_new, report)


def start(base_run: str | None, prompts: str | None, run_dir: str | Path,
          overrides: list[str] | None = None, values: dict[str, Any] | None = None,
          resume: bool = False, config_file: str | Path | None = None
          ) -> tuple[Config, RlOptions, Any, dict, LoraConfig | None]:
    """The run's config and options, the base run's tokenizer and weights, and its adapters'
    settings (None: every weight trains); a new run's choices are checked before the base run
    (maybe a large model) is read."""
    values = values or {}
    if resume:
        from sheepop.train.run_lock import check_free
        check_free(run_dir)
        opts = RlOptions.load(run_dir)
        saved = Config.from_saved(checkpoint.load_config(run_dir), str(run_dir))
        cfg = build_config(None, config_file, overrides, base=saved, values=values,
                           only=RESUME_SECTIONS)
        cfg.rl = opts.settings()
        _, tokenizer, weights = read_run(opts.base_run)
        return cfg.validate(), opts, tokenizer, weights, opts.lora_config()
    if base_run is None:
        raise UserError("sheepop rl needs BASE_RUN (or --resume)")
    if checkpoint.holds_checkpoint(run_dir):
        raise UserError(f"{run_dir} already holds a run: continue it with --resume or choose "
                        "another --out")
    settings(Config(), config_file, overrides, values).validate()  # a typo, said first
    base_run = str(Path(base_run).resolve())
    base_cfg, tokenizer, weights = read_run(base_run)
    cfg = settings(base_cfg, config_file, overrides, values).validate()
    lora = LoraConfig.for_run(cfg.lora, cfg.model, base_run, 0)  # (no tokens added)
    opts = RlOptions(base_run, str(Path(prompts).absolute()) if prompts else "",
                     asdict(cfg.rl), None if lora is None else lora.to_dict())
    return cfg, opts, tokenizer, weights, lora
