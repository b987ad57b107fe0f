"""`sheepop finetune`: supervised fine-tuning of a trained run on conversations, in full or with
LoRA adapters, through the shared trainer.

    base run --(sheepop's chat tokens added: tokenizer and weights grow)--> model
             (a base with its own chat template, e.g. an imported SmolLM2: kept as it is)
    chats.jsonl --(the chat template, loss on the assistant's tokens)--> (x, y) examples
    the shared trainer: ChatSampler batches, AdamW over every weight (full) or the adapters

What belongs to the fine-tuning lives in the run's `finetune.json`:

    {"format": "sheepop-finetune-run", "version": 1, "base_run": "/abs/path", "data": "...",
     "train_on": "assistant",
     "lora": null | {"rank": r, "alpha": a, "targets": [...], "new_tokens": n, ...},
     "method": "sft" | "dpo", "beta": 0.1, "val_data": "" | "/abs/path"}

A full fine-tune is a plain run afterwards (every weight saved; `generate`, `eval`, `chat`
read it like any other). A LoRA run saves only its adapters; `sheepop.inference.load` rebuilds the
model from the base run (the grown rows are deterministic: sheepop.arch.vocab), puts the added
tokens' trained rows in place and adds (alpha / r) B A to each adapted weight. The base run
must stay where it was.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sheepop.arch.lora import LoraConfig
from sheepop.checkpoint import format as checkpoint
from sheepop.config.build import build_config
from sheepop.config.schema import FINETUNE_SECTIONS, Config
from sheepop.data.conversations import read_conversations
from sheepop.data.dataset import Dataset
from sheepop.errors import UserError
from sheepop.files import DocumentFormat, read_fields, write_document
from sheepop.finetune.dpo import dpo_trainer
from sheepop.finetune.pairs import read_pairs
from sheepop.finetune.sampler import ChatSampler, fixed_batches
from sheepop.inference.load import grown_for, read_run
from sheepop.tokenizers.chat_format import has_model_template, with_chat_tokens

RUN_FILE = "finetune.json"
RUN_DOCUMENT = DocumentFormat("sheepop-finetune-run", 1, "sheepop fine-tuning run file")
# what a new fine-tune's settings set ([rl]: sheepop rl's)
NEW_SECTIONS = ("train", "sample", *(s for s in FINETUNE_SECTIONS if s != "rl"))
RESUME_SECTIONS = ("train", "sample")  # and a resumed one's: the rest is the run's

# Fine-tuning starts from trained weights, so it needs fewer steps and a shorter warmup than
# pretraining; LoRA's adapters start at B = 0 and learn at a higher rate than a full fine-tune
# should move every weight (docs/finetune.md). The base run's time limit and decay length
# describe its own schedule, not this one's: a base trained with `--minutes 5` would otherwise
# stop the fine-tune at 5 minutes and hold its learning rate at min_lr after the base's
# decay_steps. `--set train.*` overrides any of them.
TRAIN_DEFAULTS: dict[str, Any] = {"steps": 300, "warmup_steps": 20, "min_lr": 1e-4,
                                  "decay_steps": 0, "max_minutes": 0.0,
                                  "eval_interval": 50, "checkpoint_interval": 100,
                                  "eval_batches": 4}
LR = {"full": 5e-4, "lora": 2e-3}


@dataclass
class FinetuneOptions:
    base_run: str
    data: str
    train_on: str = "assistant"
    lora: dict[str, Any] | None = field(default=None)
    method: str = "sft"  # finetune.method and finetune.beta: a resumed run keeps them
    beta: float = 0.1
    val_data: str = ""  # finetune.val_data: the held-out examples' file ("": a share of data)

    def lora_config(self) -> LoraConfig | None:
        return None if self.lora is None else LoraConfig.from_dict(self.lora, self.base_run)

    def save(self, run_dir: str | Path) -> None:
        write_document(Path(run_dir) / RUN_FILE, RUN_DOCUMENT, asdict(self))

    @classmethod
    def load(cls, run_dir: str | Path) -> FinetuneOptions:
        return read_fields(
            Path(run_dir) / RUN_FILE, RUN_DOCUMENT, f"{run_dir} is not a fine-tuning run (no "
            f"{RUN_FILE}): start it with `sheepop finetune BASE_RUN`",
            lambda d: cls(str(d["base_run"]), str(d["data"]), str(d["train_on"]), d.get("lora"),
                          str(d.get("method", "sft")), float(d.get("beta", 0.1)),
                          str(d.get("val_data", ""))))


def base_model(base_run: str | Path) -> tuple[Config, Any, dict[str, np.ndarray], int]:
    """The base run's config, its tokenizer ready to chat (sheepop's chat tokens added, unless it
    has a template of its own), its weights grown to match, and how many tokens were added."""
    cfg, base_tokenizer, weights = read_run(base_run)
    tokenizer, added = with_chat_tokens(base_tokenizer)
    weights = grown_for(weights, base_tokenizer, tokenizer)
    cfg.model.vocab_size = tokenizer.vocab_size
    return cfg, tokenizer, weights, added


def split_examples(examples: list, val_fraction: float, seed: int) -> tuple[list, list]:
    """A held-out share of the conversations (at least one when there are two or more), the
    same for a seed."""
    order = np.random.default_rng(seed).permutation(len(examples))
    n_val = int(round(val_fraction * len(examples)))
    n_val = min(max(n_val, 1 if len(examples) > 1 and val_fraction > 0 else 0),
                len(examples) - 1)
    val = [examples[i] for i in order[:n_val]]
    return [examples[i] for i in order[n_val:]], val


def held_out(examples: list, read: Callable[[str], list], cfg: Config) -> tuple[list, list]:
    """(training examples, held-out examples): every example of DATA and those `read` from
    finetune.val_data when it names a file, else a data.val_fraction share of DATA's."""
    if cfg.finetune.val_data:
        return examples, read(cfg.finetune.val_data)
    return split_examples(examples, cfg.data.val_fraction, cfg.train.seed)


def finetune(base_run: str | None, data_path: str | None, run_dir: str | Path,
             overrides: list[str] | None = None,
             values: dict[str, Any] | None = None, resume: bool = False, log=print,
             progress: bool = True, config_file: str | Path | None = None):
    """Fine-tune `base_run` on the conversations in `data_path` into `run_dir` (or continue
    it with `resume`); the trainer's Summary.

    The settings come through the config like `train`'s (sheepop.config.build): the base run's
    model, this command's train defaults, then `config_file`, `overrides` (--set strings) and
    `values` (typed flags): train.*, sample.*, finetune.* (train_on) and lora.* (rank, alpha,
    targets, train_new_tokens), resolved once into the run's adapters (LoraConfig.for_run). On
    `resume` the fine-tuning's own settings are the run's: train.* and sample.* may change."""
    run_dir = Path(run_dir)
    values = values or {}
    if resume:
        from sheepop.train.run_lock import check_free
        check_free(run_dir)  # a running writer may be replacing the checkpoint right now
        opts = FinetuneOptions.load(run_dir)
        base_run, data_path = opts.base_run, data_path or opts.data
        adapters, train_on = opts.lora_config(), opts.train_on
        saved = Config.from_saved(checkpoint.load_config(run_dir), str(run_dir))
        cfg = build_config(None, config_file, overrides, base=saved, values=values,
                           only=RESUME_SECTIONS)
        cfg.finetune.method, cfg.finetune.beta = opts.method, opts.beta
        cfg.finetune.val_data = opts.val_data
    else:
        if base_run is None or data_path is None:
            raise UserError("sheepop finetune needs BASE_RUN and --data")
        if checkpoint.holds_checkpoint(run_dir):  # before reading anything big
            raise UserError(f"{run_dir} already holds a run: continue it with --resume or "
                            "choose another --out")
        # a mistyped setting is said before the base run (maybe a large model) is read
        _settings(Config(), config_file, overrides, values).validate()
        base_run = str(Path(base_run).resolve())
    base_cfg, tokenizer, weights, added = base_model(base_run)
    if not resume:
        cfg = _settings(base_cfg, config_file, overrides, values)
        adapters = LoraConfig.for_run(cfg.lora, cfg.model, base_run, added)
        train_on = cfg.finetune.train_on
        # absolute, as `train` records its data, so --resume works from any directory
        if cfg.finetune.val_data:
            cfg.finetune.val_data = str(Path(cfg.finetune.val_data).absolute())
        opts = FinetuneOptions(base_run, str(Path(data_path).absolute()), train_on,
                               None if adapters is None else adapters.to_dict(),
                               cfg.finetune.method, cfg.finetune.beta, cfg.finetune.val_data)
        if has_model_template(tokenizer):
            log(f"base: {base_run}; conversations through the model's own chat template "
                f"({tokenizer.vocab_size} ids)")
        else:
            log(f"base: {base_run}; the tokenizer gained {added} chat token"
                f"{'s' if added != 1 else ''} ({tokenizer.vocab_size} ids)")
    cfg.validate()
    if cfg.finetune.method == "dpo":
        def pairs_in(path: str) -> list:
            pairs = read_pairs(path, tokenizer, cfg.model.block_size, train_on)
            log(f"preference pairs: {len(pairs):,} in {path}")
            return pairs
        train_pairs, val_pairs = held_out(pairs_in(data_path), pairs_in, cfg)
        trainer = dpo_trainer(cfg, train_pairs, val_pairs, tokenizer, weights, adapters,
                              run_dir, resume, log, progress)
    else:
        trainer = _sft_trainer(cfg, data_path, tokenizer, weights, adapters, train_on, run_dir,
                               resume, log, progress)
    opts.save(run_dir)
    if adapters is not None:
        adapters.save(run_dir)  # before the first checkpoint: the adapters are nothing without it
    return trainer.run()


def _sft_trainer(cfg: Config, data_path: str, tokenizer: Any, weights: dict[str, np.ndarray],
                 adapters: LoraConfig | None, train_on: str, run_dir: Path, resume: bool, log,
                 progress: bool):
    """The shared trainer on the conversations of `data_path`: loss on the tokens `train_on`
    names, evaluated on held-out ones (`held_out`)."""
    from sheepop.train.start import setup

    def conversations_in(path: str) -> list:
        chats = read_conversations(path, tokenizer, cfg.model.block_size, train_on)
        for line in chats.report():
            log(line)
        return chats.examples
    t = cfg.train
    train, val = held_out(conversations_in(data_path), conversations_in, cfg)
    pad = tokenizer.pad_id if tokenizer.pad_id is not None else 0
    sampler = ChatSampler(train, t.batch_size, t.seed, pad)
    eval_data = fixed_batches(val, t.eval_batches * t.batch_size, pad) if val else None
    flat = np.concatenate([x for x, _ in train]).astype(np.int64)
    dataset = Dataset(flat, np.zeros(0, np.int64), tokenizer,
                      [f"conversations: {len(train):,} train, {len(val):,} held out"])
    return setup(None, cfg, run_dir, resume=resume, log=log, progress=progress,
                 dataset=dataset, sampler=sampler, eval_data=eval_data,
                 initial_weights=weights, lora=adapters)


def settings_for(base_run: str | None, config_file: str | Path | None,
                 overrides: list[str] | None, values: dict[str, Any]) -> Config:
    """The settings a new fine-tune of `base_run` (None: of a default model) would run with:
    what `sheepop finetune --help-config` shows."""
    base_cfg = Config()
    if base_run is not None:
        where = str(Path(base_run) / checkpoint.CONFIG_FILE)
        base_cfg = Config.from_saved(checkpoint.load_config(base_run), where)
    return _settings(base_cfg, config_file, overrides, values)


def _settings(base_cfg: Config, config_file: str | Path | None, overrides: list[str] | None,
              values: dict[str, Any]) -> Config:
    """A new fine-tune's config: the base run's model and sample settings, this command's train
    defaults (the learning rate LoRA's or a full fine-tune's, so the settings are read once to
    know which), then the file, `--set` and the flags."""
    def build(lr: float) -> Config:
        base = _with_train(copy.deepcopy(base_cfg), {**TRAIN_DEFAULTS, "lr": lr})
        return build_config(None, config_file, overrides, base=base, values=values,
                            only=NEW_SECTIONS)
    cfg = build(LR["full"])
    return build(LR["lora"]) if cfg.lora.rank else cfg


def _with_train(cfg: Config, values: dict[str, Any]) -> Config:
    for key, value in values.items():
        cfg.set(f"train.{key}", value, "finetune defaults")
    return cfg
