"""Configuration: one dataclass per section, presets, TOML files and `--set section.key=value`.

Every field has a default and a one-line help text (shown by `sheepop train --help-config`).
`Config.validate()` turns every impossible combination into one clear `UserError`.
Both engines read the same `ModelConfig`, so a checkpoint's `config.json` means the same thing
to each of them.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from sheepop.errors import UserError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib


def _f(default: Any, help: str, **kw: Any) -> Any:
    """A dataclass field that carries its help text."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help}, **kw)
    return field(default=default, metadata={"help": help}, **kw)


@dataclass
class ModelConfig:
    vocab_size: int = _f(0, "vocabulary size (0: taken from the tokenizer)")
    block_size: int = _f(128, "context length T in tokens")
    n_layer: int = _f(4, "number of transformer blocks")
    n_head: int = _f(4, "attention heads per block (1: the single-head model)")
    n_embd: int = _f(128, "model width d")
    d_ff: int = _f(0, "feed-forward hidden width (0: 4 * n_embd)")
    dropout: float = _f(0.0, "dropout on embeddings, attention weights and residual branches")
    pos_encoding: str = _f("sinusoidal", "positional encoding: sinusoidal | learned")
    pos_scale: float = _f(0.0, "multiplier on the sinusoidal table (0: 1/sqrt(n_embd))")
    activation: str = _f("gelu", "FFN activation: gelu (exact) | gelu_tanh | relu")
    ln_eps: float = _f(1e-5, "LayerNorm epsilon")
    bias: bool = _f(True, "biases in the attention and FFN linear layers")
    tie_weights: bool = _f(True, "share the token embedding with the output head")
    head_bias: bool = _f(False, "a bias on the output head")

    @property
    def ffn_dim(self) -> int:
        return self.d_ff or 4 * self.n_embd

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def sinusoid_scale(self) -> float:
        """The factor on the sinusoidal table P. By default 1/sqrt(d): token embeddings start at
        N(0, 0.02), and an unscaled P (entries of size ~1) would drown them (a model then
        learns little beyond unigram statistics). The original transformer fixes the same
        imbalance by multiplying the embeddings by sqrt(d); scaling P instead keeps the tied
        output head's logits at their usual size."""
        return self.pos_scale or self.n_embd ** -0.5


@dataclass
class TrainConfig:
    steps: int = _f(1000, "optimizer steps")
    batch_size: int = _f(16, "sequences per micro-batch")
    grad_accum: int = _f(1, "micro-batches per optimizer step (gradient accumulation)")
    lr: float = _f(1e-3, "peak learning rate")
    min_lr: float = _f(1e-4, "learning rate at the end of the cosine decay")
    warmup_steps: int = _f(100, "linear warmup steps")
    decay_steps: int = _f(0, "step where the cosine reaches min_lr (0: train.steps)")
    weight_decay: float = _f(0.1, "AdamW decoupled weight decay (not on biases, LayerNorm)")
    beta1: float = _f(0.9, "AdamW beta1")
    beta2: float = _f(0.99, "AdamW beta2")
    eps: float = _f(1e-8, "AdamW epsilon")
    grad_clip: float = _f(1.0, "clip the global gradient norm to this (0: off)")
    dtype: str = _f("auto", "float32 | bfloat16 | float16 | float64 (numpy engine) | auto "
                    "(bf16 on capable CUDA, else fp32)")
    device: str = _f("auto", "cpu | cuda | cuda:N | auto")
    compile: bool = _f(False, "torch.compile the model (torch engine)")
    engine: str = _f("torch", "torch | numpy")
    seed: int = _f(1337, "random seed (weights, batches, dropout)")
    eval_interval: int = _f(200, "evaluate on the val split every N steps (0: only at the end)")
    eval_batches: int = _f(20, "batches per evaluation")
    log_interval: int = _f(10, "append to metrics.jsonl every N steps")
    checkpoint_interval: int = _f(500, "write a checkpoint every N steps (0: only at the end)")
    max_minutes: float = _f(0.0, "stop after this many minutes of training (0: no limit)")
    threads: int = _f(0, "torch CPU threads (0: leave torch's default)")
    fsdp: bool = _f(False, "under torchrun: shard weights, gradients and AdamW moments over the "
                    "ranks (FSDP) instead of replicating them (DDP)")


@dataclass
class DataConfig:
    tokenizer: str = _f("char", "tokenizer kind when training one: char | word | bpe | digits")
    vocab_size: int = _f(0, "tokenizer vocabulary size for word/bpe (0: the kind's default)")
    max_bytes: int = _f(8_000_000, "read at most this many bytes of raw text")
    val_fraction: float = _f(0.1, "fraction of the tokens held out for validation")
    sampling: str = _f("random", "random windows | chunks (stride, last chunk padded)")
    stride: int = _f(0, "chunks mode: step between window starts (0: block_size)")


@dataclass
class SampleConfig:
    max_new_tokens: int = _f(200, "tokens to generate")
    temperature: float = _f(1.0, "softmax temperature (0: greedy)")
    top_k: int = _f(0, "keep the k most likely tokens (0: all)")
    top_p: float = _f(1.0, "keep the smallest set whose probability reaches p (1: all)")
    seed: int = _f(1337, "sampling seed")
    repetition_penalty: float = _f(1.0, "divide the positive logits (multiply the negative) of "
                                   "tokens already in the context by this (1: off)")


SECTIONS = {"model": ModelConfig, "train": TrainConfig, "data": DataConfig, "sample": SampleConfig}


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    data: DataConfig = field(default_factory=DataConfig)
    sample: SampleConfig = field(default_factory=SampleConfig)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {name: dataclasses.asdict(getattr(self, name)) for name in SECTIONS}

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "config") -> Config:
        cfg = cls()
        cfg.update(d, where)
        return cfg

    def update(self, d: dict[str, Any], where: str = "config") -> None:
        for section, values in d.items():
            if section not in SECTIONS:
                raise UserError(f"{where}: unknown config section '{section}' "
                                f"(known: {', '.join(SECTIONS)})")
            if not isinstance(values, dict):
                raise UserError(f"{where}: section '{section}' must be a table of keys")
            for key, value in values.items():
                self.set(f"{section}.{key}", value, where)

    def set(self, dotted: str, value: Any, where: str = "--set") -> None:
        """Set `section.key` to `value`, converting strings to the field's type."""
        section, _, key = dotted.partition(".")
        if section not in SECTIONS or not key:
            raise UserError(f"{where}: '{dotted}' must be section.key with section one of "
                            f"{', '.join(SECTIONS)}")
        obj = getattr(self, section)
        names = {f.name: f for f in fields(obj)}
        if key not in names:
            raise UserError(f"{where}: unknown config key '{dotted}' (known in [{section}]: "
                            f"{', '.join(names)})")
        setattr(obj, key, _convert(value, names[key], dotted, where))

    def validate(self) -> Config:
        m, t, d = self.model, self.train, self.data
        checks = [
            (m.n_layer >= 1, "model.n_layer must be at least 1"),
            (m.n_head >= 1, "model.n_head must be at least 1"),
            (m.n_embd >= 1, "model.n_embd must be at least 1"),
            (m.n_embd % m.n_head == 0,
             f"model.n_embd ({m.n_embd}) must be divisible by model.n_head ({m.n_head})"),
            (m.block_size >= 1, "model.block_size must be at least 1"),
            (m.d_ff >= 0, "model.d_ff must be >= 0"),
            (0.0 <= m.dropout < 1.0, "model.dropout must be in [0, 1)"),
            (m.pos_encoding in ("sinusoidal", "learned"),
             f"model.pos_encoding must be sinusoidal or learned, not '{m.pos_encoding}'"),
            (m.pos_encoding != "sinusoidal" or m.n_embd % 2 == 0,
             "model.n_embd must be even for sinusoidal positions"),
            (m.activation in ("gelu", "gelu_tanh", "relu"),
             f"model.activation must be gelu, gelu_tanh or relu, not '{m.activation}'"),
            (m.ln_eps > 0, "model.ln_eps must be positive"),
            (t.steps >= 1, "train.steps must be at least 1"),
            (t.batch_size >= 1, "train.batch_size must be at least 1"),
            (t.grad_accum >= 1, "train.grad_accum must be at least 1"),
            (t.lr > 0 and t.min_lr >= 0, "train.lr must be positive and train.min_lr >= 0"),
            (t.warmup_steps >= 0 and t.decay_steps >= 0, "warmup/decay steps must be >= 0"),
            (t.dtype in ("auto", "float32", "bfloat16", "float16", "float64"),
             f"train.dtype must be auto, float32, bfloat16, float16 or float64, not '{t.dtype}'"),
            (t.engine in ("torch", "numpy"),
             f"train.engine must be torch or numpy, not '{t.engine}'"),
            (t.eval_batches >= 1, "train.eval_batches must be at least 1"),
            (t.log_interval >= 1, "train.log_interval must be at least 1"),
            (0.0 <= d.val_fraction < 1.0, "data.val_fraction must be in [0, 1)"),
            (d.sampling in ("random", "chunks"),
             f"data.sampling must be random or chunks, not '{d.sampling}'"),
            (d.stride >= 0, "data.stride must be >= 0"),
        ]
        for ok, message in checks:
            if not ok:
                raise UserError(message)
        return self


def _convert(value: Any, f: dataclasses.Field, dotted: str, where: str) -> Any:
    kind = f.type if isinstance(f.type, type) else {"int": int, "float": float, "bool": bool,
                                                   "str": str}[str(f.type)]
    try:
        if kind is bool:
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if kind is int:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            if isinstance(value, str):
                value = value.replace("_", "")
                return int(float(value)) if "e" in value.lower() else int(value)
            return int(value)
        if kind is float:
            return float(value)
        return str(value)
    except (TypeError, ValueError):
        raise UserError(f"{where}: {dotted} expects {kind.__name__}, got {value!r}") from None


# Presets: whole configurations a user starts from; anything can be overridden after.
PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    # The `make run` default: trains for a few minutes on 2 CPU cores.
    "tiny": {
        "model": {"n_layer": 4, "n_head": 4, "n_embd": 128, "block_size": 128, "dropout": 0.0},
        "train": {"steps": 1500, "batch_size": 16, "lr": 2e-3, "min_lr": 2e-4,
                  "warmup_steps": 100, "eval_interval": 250, "eval_batches": 10,
                  "checkpoint_interval": 500},
    },
    # The classic character-level configuration (6 layers, 6 heads, 384 wide, context 256).
    "baby": {
        "model": {"n_layer": 6, "n_head": 6, "n_embd": 384, "block_size": 256, "dropout": 0.2},
        "train": {"steps": 5000, "batch_size": 64, "lr": 1e-3, "min_lr": 1e-4,
                  "warmup_steps": 100, "beta2": 0.99, "eval_interval": 250},
    },
    # GPT-2 small's shape, for GPU users.
    "gpt2-small": {
        "model": {"n_layer": 12, "n_head": 12, "n_embd": 768, "block_size": 1024,
                  "dropout": 0.0, "pos_encoding": "learned", "activation": "gelu_tanh",
                  "tie_weights": True, "bias": True},
        "train": {"steps": 5000, "batch_size": 12, "grad_accum": 40, "lr": 6e-4, "min_lr": 6e-5,
                  "warmup_steps": 200, "beta2": 0.95, "eval_interval": 500},
        "data": {"tokenizer": "bpe", "vocab_size": 50257},
    },
    # The arithmetic-progression task (sheepop.progression): the classic single-head sketch;
    # `sheepop progression train` sets block_size from the digits and the window's terms.
    # One thread: at this size a second one costs more than it gives (docs/progression.md).
    "progression": {
        "model": {"n_layer": 2, "n_head": 1, "n_embd": 64, "block_size": 23, "dropout": 0.0,
                  "pos_encoding": "sinusoidal", "activation": "relu", "tie_weights": False},
        "train": {"steps": 3000, "batch_size": 128, "lr": 3e-3, "min_lr": 3e-4,
                  "warmup_steps": 100, "eval_interval": 500, "eval_batches": 4,
                  "checkpoint_interval": 2000, "threads": 1},
        "data": {"tokenizer": "digits"},
    },
}


def register_preset(name: str, values: dict[str, dict[str, Any]]) -> None:
    """Add a preset (used by task modules such as the progression task)."""
    PRESETS[name] = values


def build_config(preset: str | None = None, config_file: str | Path | None = None,
                 overrides: list[str] | None = None, base: Config | None = None) -> Config:
    """Defaults (or `base`), then the preset, then the TOML file, then each `--set`, in order."""
    cfg = base if base is not None else Config()
    if preset is not None:
        if preset not in PRESETS:
            raise UserError(f"unknown preset '{preset}' (known: {', '.join(PRESETS)})")
        cfg.update(PRESETS[preset], f"preset {preset}")
    if config_file is not None:
        path = Path(config_file)
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise UserError(f"config file not found: {path}") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise UserError(f"config file {path} is not valid TOML: {e}") from None
        cfg.update(data, str(path))
    for item in overrides or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise UserError(f"--set expects section.key=value, got '{item}'")
        cfg.set(key.strip(), value.strip())
    return cfg


def model_config_from_json(text: str, where: str) -> ModelConfig:
    """Read the `model` section of a checkpoint's config.json."""
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{where} is not valid JSON: {e}") from None
    cfg = Config()
    cfg.update({"model": d.get("model", {})}, where)
    return cfg.model


def describe_fields() -> str:
    """Every config key with its default and help, for `--help-config` and docs/cli.md."""
    lines = []
    for section, cls in SECTIONS.items():
        lines.append(f"[{section}]")
        for f in fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            lines.append(f"  {section}.{f.name} = {default!r}    # {f.metadata['help']}")
    return "\n".join(lines)
