"""LoRA (low-rank adaptation), what both engines share: which linear layers get an adapter, the
adapters' names, shapes and initialisation, and merging them into plain weights
(docs/finetune.md, "LoRA: the mathematics").

A linear layer y = x W^T + b (W of shape (out, in)) with an adapter of rank r computes

    y = x W^T + b + s (x A^T) B^T,      A (r, in), B (out, r), s = alpha / r

with W and b frozen and only A and B trained: the update to the layer is the rank-r matrix
dW = s B A, with r (in + out) parameters instead of in * out. B starts at zero, so the adapted
model starts exactly at the base model.

Targets, by the short names a user types:

    qkv    blocks.{i}.attn.qkv            the fused query/key/value projection
    proj   blocks.{i}.attn.proj           the attention's output projection
    fc     blocks.{i}.ffn.fc              (mlp) or blocks.{i}.ffn.gate and .ffn.up (swiglu)
    down   blocks.{i}.ffn.proj            the feed-forward's output projection

Adapter parameters are named after their layer: `{prefix}.lora_A`, `{prefix}.lora_B`
(e.g. blocks.0.attn.qkv.lora_A).

New tokens. Fine-tuning on conversations adds the chat tokens at the end of the vocabulary, and
their rows (the mean of their spellings, sheepop.arch.vocab) were never trained. Frozen, the
model can read them but barely write them: an answer that never ends with `<|end|>`. So the last
`new_tokens` rows of every per-token table train with the adapters (PEFT calls this
`trainable_token_indices`), stored as whole rows, not as a difference:

    tok_emb.new_rows  (n, d)   E[V-n:]         the embedding's (and a tied head's) new rows
    head.new_rows     (n, d)   W_head[V-n:]    an untied head's
    head.new_bias     (n,)     b_head[V-n:]    a head bias's

The model uses E' = [E[:V-n]; new_rows] wherever it used E. NumPy only, like the rest of
sheepop.arch.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sheepop.arch.params import check_shapes
from sheepop.config.finetune import LORA_TARGETS, LoraSettings
from sheepop.config.schema import ModelConfig
from sheepop.errors import UserError
from sheepop.files import atomic_write_text, read_json, shown

ADAPTER_SUFFIXES = (".lora_A", ".lora_B")
LORA_FILE = "lora.json"
# A trained copy of the new tokens' rows -> the per-token table whose last rows it replaces.
NEW_ROWS = {"tok_emb.new_rows": "tok_emb.weight", "head.new_rows": "head.weight",
            "head.new_bias": "head.bias"}


def parse_targets(targets: str | Iterable[str]) -> tuple[str, ...]:
    """"qkv,proj" or ["qkv", "proj"] -> ("qkv", "proj"): known names, in LORA_TARGETS' order,
    each once; a UserError naming the known ones otherwise."""
    names = targets.split(",") if isinstance(targets, str) else list(targets)
    names = [n.strip() if isinstance(n, str) else n for n in names]
    unknown = [n for n in names if n not in LORA_TARGETS]
    if unknown:
        raise UserError(f"unknown LoRA target {shown(unknown[0])} (known: "
                        f"{', '.join(LORA_TARGETS)})")
    if not names:
        raise UserError(f"LoRA needs at least one target (known: {', '.join(LORA_TARGETS)})")
    return tuple(t for t in LORA_TARGETS if t in names)


@dataclass(frozen=True)
class LoraConfig:
    """The adapters a run has, as the engines' units take them: rank r >= 1, alpha > 0 (the
    update is scaled by s = alpha / r), the targets, the run whose weights the adapters modify,
    and how many tokens at the end of the vocabulary train their rows too (saved as lora.json
    in the adapters' run directory).

    The settings are the [lora] section's (sheepop.config.finetune.LoraSettings: the one place
    their defaults live); `for_run` resolves them once, for one model, into this: alpha 0 made
    2r, the targets in LORA_TARGETS' order, the rank checked against the model."""

    rank: int
    alpha: float
    targets: tuple[str, ...]
    base_run: str = ""  # (not settings: where the adapters belong, and what they train)
    new_tokens: int = 0

    @classmethod
    def for_run(cls, settings: LoraSettings, model: ModelConfig, base_run: str, added: int
                ) -> LoraConfig | None:
        """The adapters the [lora] settings ask for on `base_run`'s model (None: rank 0, full
        fine-tuning), with the `added` tokens' rows trained unless lora.train_new_tokens is
        false; a rank above `max_rank` is refused before any engine builds adapters of it."""
        if settings.rank == 0:
            return None
        lora = cls(settings.rank, settings.scale_alpha, settings.target_names, base_run,
                   added if settings.train_new_tokens else 0)
        check_rank(model, lora)
        return lora

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, (int, np.integer)) \
                or self.rank < 1:
            raise UserError(f"LoRA rank must be an integer >= 1, not {shown(self.rank)}")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float, np.number)) \
                or not math.isfinite(self.alpha) or self.alpha <= 0:
            raise UserError(f"LoRA alpha must be a number > 0, not {shown(self.alpha)}")
        if not isinstance(self.base_run, str):
            raise UserError(f"LoRA base_run must be a path, not {shown(self.base_run)}")
        n = self.new_tokens
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise UserError(f"LoRA new_tokens must be an integer >= 0, not {shown(n)}")
        object.__setattr__(self, "new_tokens", int(self.new_tokens))
        object.__setattr__(self, "rank", int(self.rank))
        object.__setattr__(self, "alpha", float(self.alpha))
        object.__setattr__(self, "targets", parse_targets(self.targets))

    @property
    def scale(self) -> float:
        """s = alpha / r: the factor of B A in the adapted weight W + s B A."""
        return self.alpha / self.rank

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "alpha": self.alpha, "targets": list(self.targets),
                "base_run": self.base_run, "new_tokens": self.new_tokens}

    @classmethod
    def from_dict(cls, data: Any, base_run: str = "", where: str = "LoRA settings"
                  ) -> LoraConfig:
        """The config of `data` ({"rank", "alpha", "targets"[, "base_run", "new_tokens"]}, as
        `to_dict` writes it); `base_run` when the data names none. Unknown or missing keys and
        bad values: one UserError naming `where`."""
        if not isinstance(data, Mapping):
            raise UserError(f"{where}: the LoRA settings are not a JSON object")
        unknown = sorted(set(data) - {"rank", "alpha", "targets", "base_run", "new_tokens"})
        if unknown:
            raise UserError(f"{where}: unknown LoRA setting {shown(unknown[0])}")
        missing = [k for k in ("rank", "alpha", "targets") if k not in data]
        if missing:
            raise UserError(f"{where}: the LoRA setting {shown(missing[0])} is missing")
        try:
            return cls(data["rank"], data["alpha"], data["targets"],
                       data.get("base_run", base_run), data.get("new_tokens", 0))
        except UserError as e:
            raise UserError(f"{where}: {e}") from None

    def save(self, run_dir: str | Path) -> None:
        """Write lora.json into `run_dir` (atomically)."""
        atomic_write_text(Path(run_dir) / LORA_FILE, json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, run_dir: str | Path) -> LoraConfig | None:
        """The run's lora.json, or None when the run has no adapters."""
        path = Path(run_dir) / LORA_FILE
        if not path.exists():
            return None
        return cls.from_dict(read_json(path, what=LORA_FILE), where=str(path))


# ----- which layers, and the adapters' shapes -------------------------------------------------

def target_modules(cfg: ModelConfig, target: str) -> tuple[str, ...]:
    """The module names (relative to a block) one target name stands for."""
    return {"qkv": ("attn.qkv",), "proj": ("attn.proj",),
            "fc": ("ffn.gate", "ffn.up") if cfg.ffn == "swiglu" else ("ffn.fc",),
            "down": ("ffn.proj",)}[target]


def lora_targets(cfg: ModelConfig, names: str | Iterable[str]) -> list[str]:
    """Full module prefixes of the targeted layers, block by block: "blocks.0.attn.qkv", ..."""
    targets = parse_targets(names)
    return [f"blocks.{i}.{module}" for i in range(cfg.n_layer) for t in targets
            for module in target_modules(cfg, t)]


def linear_shape(cfg: ModelConfig, prefix: str) -> tuple[int, int]:
    """(out_features, in_features) of the linear layer `prefix` (blocks.{i}.attn.qkv, ...)."""
    d, f = cfg.n_embd, cfg.ffn_dim
    module = prefix.split(".", 2)[2]
    return {"attn.qkv": ((cfg.n_head + 2 * cfg.kv_heads) * cfg.head_dim, d),
            "attn.proj": (d, d), "ffn.fc": (f, d), "ffn.gate": (f, d), "ffn.up": (f, d),
            "ffn.proj": (d, f)}[module]


def max_rank(cfg: ModelConfig, targets: str | Iterable[str]) -> int:
    """The largest useful rank on these targets: the smallest min(in, out) of the layers they
    adapt. dW = s B A of a layer has rank at most min(in, out) whatever r is, so a larger r
    only adds parameters (r (in + out) each) that express nothing full fine-tuning cannot."""
    return min(min(linear_shape(cfg, prefix)) for prefix in lora_targets(cfg, targets))


def check_rank(cfg: ModelConfig, lora: LoraConfig) -> None:
    """Refuse a rank above `max_rank` (a rank of 100,000 on a model of width 128 asked for
    307M adapter parameters on a 0.8M model, and got them)."""
    limit = max_rank(cfg, lora.targets)
    if lora.rank > limit:
        raise UserError(f"LoRA rank {lora.rank} is above {limit}, the smallest min(d_in, d_out) "
                        f"of the layers it adapts ({', '.join(lora.targets)}): beyond it the "
                        "adapters cannot express more than full fine-tuning (rank 0)")


def new_row_names(cfg: ModelConfig, lora: LoraConfig) -> dict[str, str]:
    """The trained new-token rows this model has (NEW_ROWS' entries whose table exists: the
    head's own only when untied, its bias only with head_bias); none when new_tokens is 0."""
    if lora.new_tokens == 0:
        return {}
    has = {"tok_emb.weight": True, "head.weight": not cfg.tie_weights,
           "head.bias": cfg.head_bias}
    return {name: table for name, table in NEW_ROWS.items() if has[table]}


def adapter_shapes(cfg: ModelConfig, lora: LoraConfig) -> dict[str, tuple[int, ...]]:
    """{prefix}.lora_A: (r, in) and {prefix}.lora_B: (out, r) for every targeted layer, and
    the new tokens' rows: (new_tokens, d), or (new_tokens,) for the head's bias. A rank above
    `max_rank` is refused here, where every engine and every run's lora.json comes by."""
    check_rank(cfg, lora)
    shapes: dict[str, tuple[int, ...]] = {}
    for prefix in lora_targets(cfg, lora.targets):
        out, inp = linear_shape(cfg, prefix)
        shapes[f"{prefix}.lora_A"] = (lora.rank, inp)
        shapes[f"{prefix}.lora_B"] = (out, lora.rank)
    if lora.new_tokens > cfg.vocab_size:
        raise UserError(f"LoRA new_tokens {lora.new_tokens} exceeds the vocabulary "
                        f"({cfg.vocab_size} ids)")
    for name in new_row_names(cfg, lora):
        shapes[name] = (lora.new_tokens,) if name == "head.new_bias" else \
            (lora.new_tokens, cfg.n_embd)
    return shapes


def adapter_param_count(cfg: ModelConfig, lora: LoraConfig) -> int:
    """r (in + out) summed over the targeted layers, plus the new tokens' rows."""
    return sum(math.prod(shape) for shape in adapter_shapes(cfg, lora).values())


def is_adapter(name: str) -> bool:
    """A parameter that trains under LoRA: an adapter's A or B, or a new token's rows."""
    return name.endswith(ADAPTER_SUFFIXES) or name in NEW_ROWS


def check_adapters(cfg: ModelConfig, lora: LoraConfig, adapters: Mapping[str, Any],
                   where: str = "adapters") -> None:
    """`adapters` holds exactly the config's adapter parameters, each of its shape."""
    check_shapes({k: np.shape(v) for k, v in adapters.items()}, adapter_shapes(cfg, lora),
                 where)


def init_adapters(cfg: ModelConfig, lora: LoraConfig, seed: int = 0,
                  dtype: type = np.float32, weights: Mapping[str, Any] | None = None
                  ) -> dict[str, np.ndarray]:
    """Fresh adapters: B = 0, so the adapted model starts as the base model exactly, and
    A ~ U(-1/sqrt(in), 1/sqrt(in)) from numpy.random.default_rng(seed) (PEFT's default, the
    Kaiming-uniform bound of torch's nn.Linear): each entry of x A^T then has variance
    |x|^2 / (3 in), the size of a feature, so B's first gradients s dy^T (x A^T) are too.
    The new tokens' rows start as copies of the last rows of the base `weights`' tables
    (needed when lora.new_tokens > 0), so the model starts as the base model there too."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in adapter_shapes(cfg, lora).items():
        if name in NEW_ROWS:
            if weights is None:
                raise ValueError("the new tokens' rows start from the base weights: pass them")
            out[name] = np.array(np.asarray(weights[NEW_ROWS[name]])[-lora.new_tokens:],
                                 dtype=dtype)
        elif name.endswith(".lora_A"):
            bound = 1.0 / math.sqrt(shape[1])
            out[name] = rng.uniform(-bound, bound, shape).astype(dtype)
        else:
            out[name] = np.zeros(shape, dtype=dtype)
    return out


def with_new_rows(table: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """E' = [E[:V-n]; rows]: the table the model uses, its last n rows the trained ones."""
    return np.concatenate([table[:len(table) - len(rows)], rows.astype(table.dtype)])


def merge(weights: Mapping[str, np.ndarray], adapters: Mapping[str, np.ndarray],
          lora: LoraConfig) -> dict[str, np.ndarray]:
    """Plain weights with each adapted W replaced by W + s B A (s = alpha / r, computed in
    float64, stored in W's dtype) and the new tokens' trained rows in place of the last rows
    of their tables: a model with these weights and no adapters computes what the base model
    with the adapters computes. `weights` is not modified."""
    merged = dict(weights)
    for name in adapters:
        if not is_adapter(name):
            raise UserError(f"adapters: {shown(name)} is not a lora_A, lora_B or new rows")
    for name, table in NEW_ROWS.items():
        if name in adapters:
            rows, w = np.asarray(adapters[name]), weights.get(table)
            if w is None or rows.shape != (lora.new_tokens, *np.shape(w)[1:]) \
                    or len(rows) > len(w):
                raise UserError(f"adapters: {name} {rows.shape} does not fit "
                                f"{table} {None if w is None else np.shape(w)}")
            merged[table] = with_new_rows(np.asarray(w), rows)
    prefixes = sorted({name.rsplit(".", 1)[0] for name in adapters if name not in NEW_ROWS})
    for prefix in prefixes:
        name = f"{prefix}.weight"
        if name not in weights:
            raise UserError(f"adapters: {shown(prefix)} adapts {name}, which the weights lack")
        missing = [n for n in (f"{prefix}.lora_A", f"{prefix}.lora_B") if n not in adapters]
        if missing:
            raise UserError(f"adapters: {prefix} lacks {missing[0]}")
        w = np.asarray(weights[name])
        a = np.asarray(adapters[f"{prefix}.lora_A"], dtype=np.float64)
        b = np.asarray(adapters[f"{prefix}.lora_B"], dtype=np.float64)
        if a.ndim != 2 or b.ndim != 2 or (b.shape[0], a.shape[1]) != w.shape \
                or not a.shape[0] == b.shape[1] == lora.rank:
            raise UserError(f"adapters: {prefix} has lora_A {a.shape} and lora_B {b.shape}, "
                            f"which do not fit {name} {w.shape} at rank {lora.rank}")
        merged[name] = (w.astype(np.float64) + lora.scale * (b @ a)).astype(w.dtype)
    return merged
