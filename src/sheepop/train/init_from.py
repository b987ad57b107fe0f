"""A new run from another run's model: `sheepop train DATA --init-from RUN_DIR --out NEW`.

RUN_DIR is any run directory: one `sheepop train` wrote (or its best/), an imported model
(`sheepop import`), a fine-tune, or a LoRA fine-tune (its base's weights with the adapters
merged, W + (alpha/r) B A: sheepop.inference.load.read_run). The new run takes from it

- its [model] section: the weights fix the architecture, so a setting that would change it is
  refused by name. Two may be set: model.dropout (no weight depends on it) and
  model.block_size. Lowered, positions are only read up to N (a learned table keeps its first N
  rows). Raised, only where positions are computed rather than stored (rope, sinusoidal, none:
  the same rule as `--resume`, sheepop.train.same_model; the positions past the source's context
  were never trained, and this run trains them); a learned table has no row past its last, so
  it is never raised;
- its tokenizer: raw DATA is encoded with it (pieces it lacks map to the unknown token, with a
  warning), and a prepared DATA must have been prepared with that very tokenizer;
- its weights,

and nothing of its training: a new optimizer, step 0, the warmup and cosine of this run's own
[train] settings (preset, --config, --set and flags, as for any run). config.json records

    "init_from": {"path": the source's absolute path, "step": its step (null: an import)}

which `--resume` keeps. Before the first step the run evaluates the source's weights on its
validation windows (step 0 of metrics.jsonl), so the loss curve starts where the source stood.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sheepop.checkpoint import format as checkpoint
from sheepop.config.build import build_config
from sheepop.config.schema import Config, ModelConfig
from sheepop.data.dataset import Dataset
from sheepop.data.shards import META_DOCUMENT, META_FILE, is_prepared_dir
from sheepop.data.shards import TOKENIZER_FILE as PREPARED_TOKENIZER
from sheepop.errors import UserError
from sheepop.files import MAX_JSON_BYTES, open_own_append, parse_json, read_bytes, read_document
from sheepop.inference.load import read_run
from sheepop.tokenizers import Tokenizer, load
from sheepop.tokenizers.token_bytes import perplexity
from sheepop.train.loop import evaluation_record
from sheepop.train.same_model import changes

RECORD_KEY = "init_from"
FREE_SETTINGS = "only model.dropout and model.block_size may be set"
WITH_RESUME = "--init-from starts a new run and --resume continues one: give one of them"


@dataclass
class Source:
    """The run a new run starts from: where it is, its saved config, and its step (None when
    it never trained here, e.g. an imported model)."""

    path: Path
    config: Config
    step: int | None

    def record(self) -> dict[str, Any]:
        return {"path": str(self.path), "step": self.step}


@dataclass
class StartedConfig(Config):
    """A run's config whose config.json also says where the run started (`RECORD_KEY`)."""

    init_from: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), RECORD_KEY: self.init_from}


def with_record(cfg: Config, record: dict[str, Any]) -> StartedConfig:
    return StartedConfig(cfg.model, cfg.train, cfg.data, cfg.sample, init_from=record)


def saved_record(run_dir: Path) -> dict[str, Any] | None:
    """The `init_from` record of a run's config.json (None: the run started from scratch)."""
    record = checkpoint.load_config(run_dir).get(RECORD_KEY)
    return record if isinstance(record, dict) else None


def open_source(source: str | Path, out: str | Path | None = None) -> Source:
    """RUN_DIR checked to be a run (one line otherwise) other than `out`, the new run's
    directory: the source is only ever read."""
    path = Path(source)
    if not path.is_dir():
        raise UserError(f"--init-from {source}: no such run directory")
    if not (checkpoint.holds_checkpoint(path)
            and checkpoint.current_path(path, checkpoint.CONFIG_FILE).is_file()):
        raise UserError(f"--init-from {source}: not a run directory (a run holds "
                        f"{checkpoint.MODEL_FILE}, {checkpoint.CONFIG_FILE} and "
                        f"{checkpoint.TOKENIZER_FILE}); give one made by sheepop train, import "
                        "or finetune")
    if out is not None and Path(out).resolve() == path.resolve():
        raise UserError(f"--init-from {source} and --out {out} are the same directory: the new "
                        "run needs its own --out (the source is never written)")
    where = str(path / checkpoint.CONFIG_FILE)
    return Source(path.resolve(), Config.from_saved(checkpoint.load_config(path), where),
                  _trained_steps(path))


def _trained_steps(path: Path) -> int | None:
    """The step of the source's checkpoint (trainer.json; best.json for a best/ folder), or
    None for a model that was not trained here. Only the step is read: no optimizer state."""
    for name in (checkpoint.TRAINER_JSON, checkpoint.BEST_JSON):
        where = checkpoint.current_path(path, name)
        if where.is_file():
            record = parse_json(read_bytes(where, None, name, MAX_JSON_BYTES), str(where))
            step = record.get("step") if isinstance(record, dict) else None
            return step if type(step) is int and step >= 0 else None
    return None


def init_config(source: Source, preset: str | None = None, config_file: str | None = None,
                overrides: list[str] | None = None, values: dict[str, Any] | None = None
                ) -> Config:
    """The new run's config: the source's [model], [sample] and tokenizer settings, then the
    preset's other sections, the TOML file, `--set` and the flags, as `build_config` applies
    them; a change to the model's architecture or to the tokenizer is refused by name."""
    cfg = build_config(preset)  # (its [model] is replaced by the source's just below)
    cfg.model = copy.deepcopy(source.config.model)
    cfg.sample = copy.deepcopy(source.config.sample)
    for key in ("tokenizer", "vocab_size"):
        setattr(cfg.data, key, getattr(source.config.data, key))
    cfg = build_config(None, config_file, overrides, base=cfg, values=values)
    for key in ("tokenizer", "vocab_size"):
        mine, theirs = getattr(cfg.data, key), getattr(source.config.data, key)
        if mine != theirs:
            raise UserError(f"--init-from {source.path}: the run's tokenizer comes with its "
                            f"model (data.{key} is {theirs!r}, the config asks for {mine!r}): "
                            f"leave data.{key} unset")
    check_model(source, cfg.model)
    return cfg


def check_model(source: Source, asked: ModelConfig) -> str | None:
    """A UserError naming each model setting `asked` changes against the source's, and the
    block size rule (module docstring); the line to show when the context grows past the
    source's, else None."""
    have = source.config.model
    found = changes(have, dataclasses.replace(asked, block_size=have.block_size))
    if found:
        raise UserError(f"--init-from {source.path}: {'; '.join(found)}: a new run keeps its "
                        f"source's model ({FREE_SETTINGS})")
    if asked.block_size <= have.block_size:
        return None
    if have.pos_encoding == "learned":
        raise UserError(f"--init-from {source.path}: model.block_size {asked.block_size} is past "
                        f"the {have.block_size} rows of the run's learned position table "
                        f"(pos_emb.weight): it can be lowered, not raised")
    return (f"context {asked.block_size}, past the source's {have.block_size}: {have.pos_encoding}"
            " positions are computed, but the source never trained on those; this run does")


def start_from(source: Source, cfg: Config, data_path: str | Path | None, log
               ) -> tuple[StartedConfig, Tokenizer, dict[str, np.ndarray]]:
    """The new run's config (with its record), the source's tokenizer and its weights, each
    checked before anything big is read; says so in one line (and the context's note)."""
    note = check_model(source, cfg.model)
    tokenizer, weights = source_model(source, cfg.model)
    check_prepared(data_path, tokenizer, source)
    log(f"init from {source.path}"
        + (f" (step {source.step})" if source.step is not None else "")
        + ": its model, tokenizer and weights; a new optimizer, from step 0")
    if note is not None:
        log(note)
    return with_record(cfg, source.record()), tokenizer, weights


def source_model(source: Source, model: ModelConfig) -> tuple[Tokenizer, dict[str, np.ndarray]]:
    """The source's tokenizer and weights (a LoRA run's merged), cut to `model`'s context: a
    learned position table keeps its first block_size rows, the only positions read."""
    _, tokenizer, weights = read_run(source.path)
    table = weights.get("pos_emb.weight")
    if model.pos_encoding == "learned" and table is not None:
        weights = {**weights, "pos_emb.weight": table[:model.block_size]}
    return tokenizer, weights


def check_prepared(data_path: str | Path | None, tokenizer: Tokenizer, source: Source) -> None:
    """A prepared DATA directory must hold the ids of the source's own tokenizer."""
    if data_path is None or not is_prepared_dir(data_path):
        return
    prepared = load(Path(data_path) / PREPARED_TOKENIZER)
    again = (f"prepare the text again with the run's tokenizer (sheepop prepare INPUT "
             f"--tokenizer {source.path / checkpoint.TOKENIZER_FILE} --out DATA_DIR) or give "
             "the text itself")
    if prepared.kind != tokenizer.kind:
        raise UserError(f"{data_path} was prepared with a {prepared.kind} tokenizer, but the "
                        f"model of {source.path} reads {tokenizer.kind} ids: {again}")
    if prepared.to_json() != tokenizer.to_json():
        raise UserError(f"{data_path} was prepared with another {prepared.kind} tokenizer "
                        f"({prepared.vocab_size:,} ids) than the model of {source.path} reads "
                        f"({tokenizer.vocab_size:,} ids): {again}")


def unknown_warning(data: Dataset, data_path: str | Path | None) -> str | None:
    """The warning for data the tokenizer cannot encode (pieces mapped to <|unk|>), worded as
    `sheepop generate` words it for a prompt; None when there are none."""
    if data.unknown is not None:  # raw text: the characters themselves, with examples
        from sheepop.tokenizers.unknown import unknown_warning as pieces_warning
        return pieces_warning(data.tokenizer, data.unknown, "the data")
    unk = data.tokenizer.unk_id
    if unk is None:
        return None
    if data.source is not None and data.source.get("kind") == "prepared":
        # (counted by `prepare`; the shards are not read again for it)
        meta = read_document(Path(str(data_path)) / META_FILE, META_DOCUMENT)
        summary = meta.get("summary")
        unknown = summary.get("unknown_tokens", 0) if isinstance(summary, dict) else 0
    else:
        unknown = sum(int(np.count_nonzero(ids == unk)) for ids in (data.train, data.val))
    if not isinstance(unknown, int) or unknown <= 0:
        return None
    return (f"warning: {unknown:,} piece(s) of the data are not in the vocabulary and map to the "
            "unknown token")


def evaluate_start(trainer: Any, source: Source, log) -> None:
    """The source's weights on the new run's validation windows, before any step: logged,
    and step 0 of metrics.jsonl (and TensorBoard's). It is not a candidate for best/: best/
    holds what this run trained."""
    val = trainer.evaluate()
    if val is None:
        return
    loss, bpb = val
    record: dict[str, Any] = {"step": 0, **evaluation_record(loss, bpb)}
    per_byte = f", {bpb:.4f} bits/byte" if bpb is not None else ""
    log(f"step 0/{trainer.cfg.train.steps}  val loss {loss:.4f} (perplexity {perplexity(loss):.2f}"
        f"{per_byte}): the weights of {source.path} before training")
    if trainer.events is not None:
        trainer.events.write(record)
    if trainer.is_main:
        try:
            with open_own_append(trainer.metrics_path) as f:  # never through a link
                f.write(json.dumps(record) + "\n")
        except OSError as e:  # e.g. a full disk: one line, nothing trained yet
            raise UserError(f"writing the metrics of step 0 in {trainer.run_dir} failed: "
                            f"{checkpoint.describe_os_error(e)}") from None
