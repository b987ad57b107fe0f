"""`sheepop finetune`: supervised fine-tuning of a trained run on conversations, in full or with
LoRA adapters, through the shared trainer.

    base run --(sheepop's chat tokens added: tokenizer and weights grow)--> model
             (a base with its own chat template, e.g. an imported SmolLM2: kept as it is)
    chats.jsonl --(the chat template, loss on the assistant's tokens)--> (x, y) examples
    the shared trainer: ChatSampler batches, AdamW over every weight (full) or the adapters

What belongs to the fine-tuning lives in the run's `finetune.json`:

    {"format": "sheepop-finetune-run", "version": 1, "base_run": "/abs/path", "data": "...",
     "train_on": "assistant",
     "lora": null | {"rank": r, "alpha": a, "targets": [...], "new_tokens": n, ...}}

A full fine-tune is a plain run afterwards (every weight saved; `generate`, `eval`, `chat`
read it like any other). A LoRA run saves only its adapters; `sheepop.inference.load` rebuilds the
model from the base run (the grown rows are deterministic: sheepop.arch.vocab), puts the added
tokens' trained rows in place and adds (alpha / r) B A to each adapted weight. The base run
must stay where it was.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sheepop.arch.lora import LoraConfig
from sheepop.checkpoint import format as checkpoint
from sheepop.config.schema import Config
from sheepop.data.chat import read_conversations
from sheepop.data.dataset import Dataset
from sheepop.errors import UserError
from sheepop.files import DocumentFormat, read_document, write_document
from sheepop.finetune.sampler import ChatSampler, fixed_batches
from sheepop.inference.load import grown_for, read_run
from sheepop.tokenizers.chat import has_model_template, with_chat_tokens

RUN_FILE = "finetune.json"
RUN_DOCUMENT = DocumentFormat("sheepop-finetune-run", 1, "sheepop fine-tuning run file")
TRAIN_ON = ("assistant", "all")

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

    def lora_config(self) -> LoraConfig | None:
        return None if self.lora is None else LoraConfig.from_dict(self.lora, self.base_run)

    def save(self, run_dir: str | Path) -> None:
        write_document(Path(run_dir) / RUN_FILE, RUN_DOCUMENT, asdict(self))

    @classmethod
    def load(cls, run_dir: str | Path) -> FinetuneOptions:
        path = Path(run_dir) / RUN_FILE
        d = read_document(path, RUN_DOCUMENT, f"{run_dir} is not a fine-tuning run (no "
                          f"{RUN_FILE}): start it with `sheepop finetune BASE_RUN`")
        try:
            return cls(str(d["base_run"]), str(d["data"]), str(d["train_on"]), d.get("lora"))
        except (KeyError, TypeError) as e:
            raise UserError(f"{path}: missing or bad field {e}") from None


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


def finetune(base_run: str | None, data_path: str | None, run_dir: str | Path,
             lora: LoraConfig | None = None, train_on: str = "assistant",
             overrides: list[str] | None = None, values: dict[str, Any] | None = None,
             resume: bool = False, log=print, progress: bool = True,
             train_new_tokens: bool = True):
    """Fine-tune `base_run` on the conversations in `data_path` into `run_dir` (or continue
    it with `resume`); the trainer's Summary. With LoRA, the rows of the tokens added to the
    vocabulary train with the adapters unless `train_new_tokens` is False (sheepop.arch.lora)."""
    from sheepop.config.build import build_config
    from sheepop.train.start import setup
    run_dir = Path(run_dir)
    if resume:
        from sheepop.train.run_lock import check_free
        check_free(run_dir)  # a running writer may be replacing the checkpoint right now
        opts = FinetuneOptions.load(run_dir)
        base_run, data_path = opts.base_run, data_path or opts.data
        lora, train_on = opts.lora_config(), opts.train_on
        saved = Config.from_saved(checkpoint.load_config(run_dir), str(run_dir))
        cfg = build_config(None, None, overrides, base=saved, values=values,
                           only=("train", "sample"))
    else:
        if train_on not in TRAIN_ON:
            raise UserError(f"--train-on must be one of {', '.join(TRAIN_ON)}, not {train_on!r}")
        if base_run is None or data_path is None:
            raise UserError("sheepop finetune needs BASE_RUN and --data")
        if checkpoint.holds_checkpoint(run_dir):  # before reading anything big
            raise UserError(f"{run_dir} already holds a run: continue it with --resume or "
                            "choose another --out")
        base_run = str(Path(base_run).resolve())
    base_cfg, tokenizer, weights, added = base_model(base_run)
    if not resume:
        if lora is not None:
            lora = LoraConfig(lora.rank, lora.alpha, lora.targets, base_run,
                              added if train_new_tokens else 0)
        # absolute, as `train` records its data, so --resume works from any directory
        opts = FinetuneOptions(base_run, str(Path(data_path).absolute()), train_on,
                               None if lora is None else lora.to_dict())
        cfg = base_cfg
        defaults = {**TRAIN_DEFAULTS, "lr": LR["lora" if lora else "full"]}
        cfg = build_config(None, None, overrides, base=_with_train(cfg, defaults),
                           values=values, only=("train", "sample"))
        if has_model_template(tokenizer):
            log(f"base: {base_run}; conversations through the model's own chat template "
                f"({tokenizer.vocab_size} ids)")
        else:
            log(f"base: {base_run}; the tokenizer gained {added} chat token"
                f"{'s' if added != 1 else ''} ({tokenizer.vocab_size} ids)")
    cfg.validate()
    chats = read_conversations(data_path, tokenizer, cfg.model.block_size, train_on)
    for line in chats.report():
        log(line)
    t = cfg.train
    train, val = split_examples(chats.examples, cfg.data.val_fraction, t.seed)
    pad = tokenizer.pad_id if tokenizer.pad_id is not None else 0
    sampler = ChatSampler(train, t.batch_size, t.seed, pad)
    eval_data = fixed_batches(val, t.eval_batches * t.batch_size, pad) if val else None
    flat = np.concatenate([x for x, _ in train]).astype(np.int64)
    dataset = Dataset(flat, np.zeros(0, np.int64), tokenizer,
                      [f"conversations: {len(train):,} train, {len(val):,} held out"])
    trainer = setup(None, cfg, run_dir, resume=resume, log=log, progress=progress,
                    dataset=dataset, sampler=sampler, eval_data=eval_data,
                    initial_weights=weights, lora=lora)
    opts.save(run_dir)
    if lora is not None:
        lora.save(run_dir)  # before the first checkpoint: the adapters are nothing without it
    return trainer.run()


def _with_train(cfg: Config, values: dict[str, Any]) -> Config:
    for key, value in values.items():
        cfg.set(f"train.{key}", value, "finetune defaults")
    return cfg
