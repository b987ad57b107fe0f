"""Configuration: one dataclass per section, and the whole `Config` (config.json, setting
`section.key`, validation). Building one from a preset, a TOML file, `--set section.key=value`
and flags, in that order: `sheepop.config.build`.

Every field has a default and a one-line help text (shown by `sheepop train --help-config`).
`Config.validate()` turns every impossible combination into one clear `UserError`.
Both engines read the same `ModelConfig`, so a checkpoint's `config.json` means the same thing
to each of them.

One owner per setting: the allowed values of each choice below are the only list of them (the
command line's `choices=`, the help texts and `validate()` read them from here, so a new kind is
a one-line change); `model.vocab_size` is derived from the tokenizer (`resolve_vocab_size`);
the `[sample]` section is what `sheepop generate` uses, its flags override it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from typing import Any

from sheepop.config.checks import check_config
from sheepop.config.finetune import FinetuneConfig, LoraSettings
from sheepop.config.layer_kinds import FFN_SHAPES, NORM_VECTORS, POSITION_KINDS, default_ffn_width
from sheepop.config.rl import RlConfig
from sheepop.config.setting import setting
from sheepop.config.values import convert_value
from sheepop.errors import UserError
from sheepop.files import shown
from sheepop.words import near_match

# The allowed values of every setting that is one of a list.
ENGINES = ("torch", "numpy")
INFERENCE_ENGINES = ("auto", *ENGINES)  # auto: sheepop.inference.load.choose_engine
DTYPES = ("auto", "float32", "bfloat16", "float16", "float64")
OPTIMIZERS = ("adamw", "muon")
SCHEDULES = ("cosine", "wsd")
MUON_NS_DTYPES = ("auto", "bfloat16", "float32")
# `sheepop generate --dtype`: how the weights are stored (int8: the linear layers' weights with
# per-channel scales; int4: in 4-bit groups; sheepop.arch.quantize), in both engines: the NumPy
# engine's matrices (sheepop.scratch.narrow), the torch engine's too, and in bfloat16 its
# activations and KV cache as well (sheepop.model.quantized*, TorchLM.cast)
INFERENCE_DTYPES = ("float32", "bfloat16", "int8", "int4")
POS_ENCODINGS = tuple(POSITION_KINDS)
ACTIVATIONS = ("gelu", "gelu_tanh", "relu", "relu2", "silu")
NORMS = tuple(NORM_VECTORS)  # the layer kinds, with what each costs: sheepop.config.layer_kinds
FFNS = tuple(FFN_SHAPES)
TOKENIZER_KINDS = ("char", "word", "bpe", "digits", "pretrained")  # pretrained: imported only
SAMPLING_MODES = ("random", "chunks")

# What config.json's sections mean ("config_version"; a file without it is version 1).
# 2: `sheepop generate` reads [sample]. A version-1 file's [sample] holds defaults nothing ever
# read (temperature 1.0), so it is ignored on load and the run generates as it always did.
# 3: [sample] defaults to llama.cpp's top-k 40, top-p 0.95, min-p 0.05 and a fresh seed; a
# version-2 file's [sample] keys that hold version 2's defaults are read as not set.
CONFIG_VERSION = 3
VERSION_KEY = "config_version"
# The [sample] defaults that changed in version 3 (top-k, top-p and a fresh seed by default).
V2_SAMPLE_DEFAULTS = {"top_k": 0, "top_p": 1.0, "seed": 1337}


@dataclass
class ModelConfig:
    vocab_size: int = setting(0, "vocabulary size (0: taken from the tokenizer; another value must "
                              "equal the tokenizer's)")
    block_size: int = setting(128, "context length T in tokens")
    n_layer: int = setting(4, "number of transformer blocks")
    n_head: int = setting(4, "attention heads per block (1: the single-head model)")
    n_kv_head: int = setting(0, "key/value heads per block (0: n_head; fewer: grouped-query "
                             "attention, 1: multi-query), a divisor of n_head")
    n_embd: int = setting(128, "model width d")
    d_ff: int = setting(0, "feed-forward hidden width (0: 4 * n_embd for mlp; for swiglu the "
                        "multiple of 64 nearest 8 * n_embd / 3)")
    dropout: float = setting(0.0, "dropout on embeddings, attention weights and residual branches")
    pos_encoding: str = setting("sinusoidal", "positional encoding", POS_ENCODINGS)
    pos_scale: float = setting(0.0, "multiplier on the sinusoidal table (0: 1/sqrt(n_embd))")
    rope_theta: float = setting(10000.0, "rope: the base of the rotation frequencies "
                                "theta^(-2i/head_dim)")
    digit_positions: int = setting(0, "digit places (digits tokenizer): rows of a learned table "
                                   "added at each digit by its place in its number, 1 = the first "
                                   "digit written (0: off; docs/math/03-positions.md)")
    digit_offset: int = setting(0, "digit places, training only: a random 0..N added to every "
                                "place of a sequence, so rows past the training numbers' length "
                                "are trained too")
    term_positions: int = setting(0, "term indices (digits tokenizer): rows of a learned table "
                                  "added at each token by how many numbers end before it (0: off)")
    activation: str = setting("gelu", "FFN activation (gelu: the exact erf form)", ACTIVATIONS)
    norm: str = setting("layernorm", "normalisation before attention, FFN and head", NORMS)
    ffn: str = setting("mlp", "feed-forward kind (mlp: act(x W_fc^T) W_proj^T, act = activation; "
                       "swiglu: (silu(x W_gate^T) * x W_up^T) W_proj^T)", FFNS)
    ln_eps: float = setting(1e-5, "epsilon of the norms (layernorm and rmsnorm)")
    bias: bool = setting(True, "biases in the attention and FFN linear layers")
    tie_weights: bool = setting(True, "share the token embedding with the output head")
    head_bias: bool = setting(False, "a bias on the output head")
    qk_norm: bool = setting(False, "RMS-normalise (no gain) each head's queries and keys before "
                            "RoPE: every score within +-sqrt(d_k) (modded-nanogpt)")
    logit_softcap: float = setting(0.0, "cap the logits smoothly below c: c tanh(z / c) "
                                   "(0: off; Gemma 2 uses 30, modded-nanogpt 15)")
    zero_init_proj: bool = setting(False, "start the residual branches' output projections "
                                   "(attn.proj, ffn.proj) at zero: each block begins as the "
                                   "identity (modded-nanogpt)")
    value_embeds: int = setting(0, "value-embedding tables: the first N layers and the last N "
                                "mix a token's row of table j into their attention's values, "
                                "v = lam v + (1 - lam) T_j[x] (0: off; at most n_layer / 2; "
                                "modded-nanogpt uses 3 of 12 layers)")
    unet_skips: bool = setting(False, "U-net skips: the first half's block outputs are added, "
                               "times a learned weight each, to the inputs of the mirrored "
                               "second-half blocks (modded-nanogpt)")

    @property
    def ffn_dim(self) -> int:
        return self.d_ff or default_ffn_width(self.ffn, self.n_embd)

    @property
    def kv_heads(self) -> int:
        """Key/value heads: n_kv_head, or n_head when 0 (plain multi-head attention)."""
        return self.n_kv_head or self.n_head

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
    steps: int = setting(1000, "optimizer steps")
    batch_size: int = setting(16, "sequences per micro-batch")
    grad_accum: int = setting(1, "micro-batches per optimizer step (gradient accumulation)")
    lr: float = setting(1e-3, "peak learning rate")
    min_lr: float = setting(1e-4, "learning rate at the end of the cosine decay")
    warmup_steps: int = setting(100, "linear warmup steps")
    decay_steps: int = setting(0, "step where the decay reaches min_lr (0: train.steps)")
    schedule: str = setting("cosine", "{choices}: after the warmup, a cosine to min_lr, or "
                            "warmup-stable-decay (lr held, then a straight line to min_lr over "
                            "the last train.cooldown of the steps)", SCHEDULES)
    cooldown: float = setting(0.2, "wsd: the fraction of train.decay_steps spent decaying")
    weight_decay: float = setting(0.1, "AdamW decoupled weight decay (not on biases, LayerNorm)")
    beta1: float = setting(0.9, "AdamW beta1")
    beta2: float = setting(0.99, "AdamW beta2")
    eps: float = setting(1e-8, "AdamW epsilon")
    optimizer: str = setting("adamw", "{choices} (muon: Muon for the blocks' matrices, AdamW for "
                             "embeddings, head, gains and biases; docs/derivations/muon.md)",
                             OPTIMIZERS)
    muon_lr: float = setting(0.02, "Muon's peak learning rate (the schedule scales it as lr)")
    muon_momentum: float = setting(0.95, "Muon's momentum (Nesterov)")
    muon_ns_steps: int = setting(5, "Newton-Schulz steps of Muon's orthogonalisation, both "
                                 "engines (fewer: a cheaper step, a rougher U V^T)")
    muon_ns_dtype: str = setting("auto", "{choices}: the torch engine's Newton-Schulz iteration "
                                 "(auto: bfloat16 where the device has bf16 instructions, else "
                                 "float32; the NumPy engine's is always its own dtype)",
                                 MUON_NS_DTYPES)
    grad_clip: float = setting(1.0, "clip the global gradient norm to this (0: off)")
    max_grad_norm: float = setting(1000.0, "stop, before saving, when the gradient norm (before "
                                   "clipping) passes this: a diverging run (0: no limit)")
    dtype: str = setting("auto", "{choices} (float64: numpy engine; auto: bf16 on capable CUDA, "
                         "else fp32)", DTYPES)
    device: str = setting("auto", "cpu | cuda | cuda:N | auto")
    compile: bool = setting(False, "torch.compile the model (torch engine)")
    engine: str = setting("torch", "the engine that trains", ENGINES)
    seed: int = setting(1337, "random seed (weights, batches, dropout)")
    eval_interval: int = setting(200, "evaluate on the val split every N steps (0: only at the "
                                 "end)")
    eval_batches: int = setting(20, "batches per evaluation")
    log_interval: int = setting(10, "append to metrics.jsonl every N steps")
    checkpoint_interval: int = setting(500, "write a checkpoint every N steps (0: only at the end)")
    keep_last: int = setting(1, "checkpoints kept: the run directory holds the latest; N > 1 also "
                             "keeps the newest N as checkpoints/step-NNNNNNN/ (hard links)")
    early_stop_patience: int = setting(0, "stop after N evaluations in a row without a new best "
                                       "val loss (0: never); the best is kept in best/ either way")
    tensorboard: bool = setting(False, "also write the metrics as TensorBoard events in "
                                "RUN_DIR/tensorboard/ (needs: pip install 'sheepop[tensorboard]')")
    max_minutes: float = setting(0.0, "stop after this many minutes of training (0: no limit)")
    target_val_loss: float = setting(0.0, "stop at the first evaluation whose val loss is at or "
                                     "below this; the summary says at which step and second "
                                     "(0: off)")
    threads: int = setting(0, "threads of torch and of the NumPy engine's BLAS (0: auto, the cores "
                              "the load average leaves idle; sheepop.threads)")
    fsdp: bool = setting(False, "under torchrun: shard weights, gradients and AdamW moments over "
                         "the ranks (FSDP) instead of replicating them (DDP)")


@dataclass
class DataConfig:
    tokenizer: str = setting("char", "tokenizer kind when training one", TOKENIZER_KINDS)
    vocab_size: int = setting(0, "tokenizer vocabulary size for word/bpe (0: the kind's default)")
    max_bytes: int = setting(8_000_000, "read at most this many bytes of raw text")
    text_field: str = setting("text", "JSON Lines / Parquet: the key or column holding the text; "
                              "a dotted path (meta.body) for a nested field")
    follow_links: bool = setting(False, "raw-text DATA: also read what symbolic links leading "
                                 "outside it point to (by default they are skipped and listed)")
    val_fraction: float = setting(0.1, "fraction of the tokens held out for validation")
    val_data: str = setting("", "a file or folder of raw text to validate on, read with the "
                            "run's tokenizer; all of DATA then trains (no val_fraction split)")
    sampling: str = setting("random", "{choices}: random windows, or chunks (stride, last chunk "
                            "padded)", SAMPLING_MODES)
    stride: int = setting(0, "chunks mode: step between window starts (0: block_size)")


@dataclass
class SampleConfig:
    """How `sheepop generate` samples (a run's [sample] section; its flags override it)."""
    max_new_tokens: int = setting(200, "tokens to generate")
    # llama.cpp's defaults (its server and CLI): a real model's tail of unlikely tokens is cut
    # before the draw (at T 0.8 alone SmolLM2-135M-Instruct began "What is the capital of
    # France?" in English 22% of the time, now 26%: docs/real-models.md). A model's own
    # generation_config.json, imported, replaces them (sheepop.interop.generation_config).
    temperature: float = setting(0.8, "softmax temperature (0: greedy; 1: the model's own "
                                 "distribution; below 1 sharper)")
    top_k: int = setting(40, "keep the k most likely tokens (0: all)")
    top_p: float = setting(0.95, "keep the smallest set whose probability reaches p (1: all)")
    min_p: float = setting(0.05, "keep the tokens whose probability is at least min_p times the "
                           "most likely one's (0: all)")
    seed: int = setting(-1, "sampling seed (-1: a fresh one each time, printed)")
    repetition_penalty: float = setting(1.0, "divide the positive logits (multiply the negative) "
                                        "of tokens already in the context by this (1: off)")
    slide_chunk: int = setting(0, "past the context, absolute positions: the oldest tokens dropped "
                               "at once, so the cache is refilled once per chunk (1: always the "
                               "last block_size tokens, the slowest; 0: block_size // 4)")
    speculate: int = setting(0, "speculative decoding by prompt lookup: check up to this many "
                             "tokens guessed from the text in one forward pass (the same "
                             "greedy output, the same distribution; 0: off)")


# The sections of a run: its config.json holds these.
RUN_SECTIONS = {"model": ModelConfig, "train": TrainConfig, "data": DataConfig,
                "sample": SampleConfig}
# The settings of the commands that start from a trained run, `sheepop finetune` and `sheepop
# rl`, which record them in their own files (finetune.json, lora.json, rl.json): set anywhere
# else, they are refused, never saved and ignored.
FINETUNE_SECTIONS = {"finetune": FinetuneConfig, "lora": LoraSettings, "rl": RlConfig}
SECTIONS = {**RUN_SECTIONS, **FINETUNE_SECTIONS}


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    data: DataConfig = field(default_factory=DataConfig)
    sample: SampleConfig = field(default_factory=SampleConfig)
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)
    lora: LoraSettings = field(default_factory=LoraSettings)
    rl: RlConfig = field(default_factory=RlConfig)

    def to_dict(self) -> dict[str, Any]:
        """The run's sections, and the version of their meaning (what a run's config.json
        holds; the fine-tuning's sections live in its own files)."""
        return {VERSION_KEY: CONFIG_VERSION,
                **{name: dataclasses.asdict(getattr(self, name)) for name in RUN_SECTIONS}}

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "config") -> Config:
        cfg = cls()
        version = d.get(VERSION_KEY, CONFIG_VERSION)
        if type(version) is not int or version < 1:
            raise UserError(f"{where}: {VERSION_KEY} must be a positive integer, not "
                            f"{shown(version)}")
        if version > CONFIG_VERSION:
            raise UserError(f"{where}: {VERSION_KEY} is {version!r}, this sheepop reads up to "
                            f"{CONFIG_VERSION}: upgrade sheepop")
        cfg.update({k: v for k, v in d.items() if k != VERSION_KEY}, where)
        return cfg

    @classmethod
    def from_saved(cls, saved: dict[str, Any], where: str) -> Config:
        """A run's config.json (its format keys and any other entries are not sections)."""
        sections = {k: v for k, v in saved.items() if k in RUN_SECTIONS}
        version = saved.get(VERSION_KEY, 1)
        if type(version) is int and version < 2:  # [sample] was never read: defaults
            sections.pop("sample", None)
        elif type(version) is int and version < 3 and isinstance(sections.get("sample"), dict):
            # Version 2 wrote every [sample] key, its defaults too: a key that holds version
            # 2's default was (almost always) never set, so today's default applies.
            sections["sample"] = {k: v for k, v in sections["sample"].items()
                                  if k not in V2_SAMPLE_DEFAULTS or V2_SAMPLE_DEFAULTS[k] != v}
        return cls.from_dict({VERSION_KEY: version, **sections}, where)

    def update(self, d: dict[str, Any], where: str = "config",
               only: tuple[str, ...] | None = None) -> None:
        """Set every `section.key` of a nested dict; sections outside `only` are skipped. Without
        `only`, the run's sections: a fine-tuning section is refused (`sheepop finetune` names
        them in `only`)."""
        for section, values in d.items():
            if section not in SECTIONS:
                raise UserError(f"{where}: unknown config section '{section}' "
                                f"(known: {', '.join(SECTIONS)})")
            if not isinstance(values, dict):
                raise UserError(f"{where}: section '{section}' must be a table of keys")
            if only is None and section in FINETUNE_SECTIONS:
                raise UserError(f"{where}: [{section}] is read by sheepop "
                                f"{'rl' if section == 'rl' else 'finetune'} only")
            if only is not None and section not in only:
                continue
            for key, value in values.items():
                self.set(f"{section}.{key}", value, where)

    def set(self, dotted: str, value: Any, where: str = "--set") -> None:
        """Set `section.key` to `value`: a typed value (a flag's, a TOML file's) or a string
        (`--set`), converted to the field's type."""
        f = config_field(dotted, where)
        section, _, key = dotted.partition(".")
        setattr(getattr(self, section), key, convert_value(value, f, dotted, where))

    def validate(self) -> Config:
        """One UserError for the first impossible value (the rules: sheepop.config.checks)."""
        check_config(self, SECTIONS)
        return self


def resolve_vocab_size(model: ModelConfig, tokenizer_vocab: int, where: str) -> None:
    """`model.vocab_size` is derived from the tokenizer: 0 takes `tokenizer_vocab`, a value set
    by the user must equal it (a saved run's does), anything else is a `UserError`."""
    if model.vocab_size not in (0, tokenizer_vocab):
        raise UserError(f"model.vocab_size is {model.vocab_size} but {where} has "
                        f"{tokenizer_vocab} ids: leave model.vocab_size at 0 (taken from the "
                        "tokenizer), or size a trained tokenizer with data.vocab_size")
    model.vocab_size = tokenizer_vocab


def config_field(dotted: str, where: str = "--set") -> dataclasses.Field:
    """The dataclass field of `section.key` (its type, default, help and choices)."""
    section, _, key = dotted.partition(".")
    if section not in SECTIONS or not key:
        raise UserError(f"{where}: '{dotted}' must be section.key with section one of "
                        f"{', '.join(SECTIONS)}{_did_you_mean(section, key)}")
    names = {f.name: f for f in fields(SECTIONS[section])}
    if key not in names:
        raise UserError(f"{where}: unknown config key '{dotted}'{_did_you_mean(section, key)} "
                        f"(known in [{section}]: {', '.join(names)})")
    return names[key]


def _did_you_mean(section: str, key: str) -> str:
    """' (did you mean model.n_layer?)' for a misspelt key, as options get it: the same key in
    another section (train.block_size: model.block_size), or the nearest key of its section
    (of the nearest section when the section is misspelt); '' when nothing is near."""
    elsewhere = [s for s, cls in SECTIONS.items() if key in {f.name for f in fields(cls)}]
    if elsewhere:
        return f" (did you mean {elsewhere[0]}.{key}?)"
    near = section if section in SECTIONS else near_match(section, SECTIONS)
    close = near and near_match(key, [f.name for f in fields(SECTIONS[near])])
    return f" (did you mean {near}.{close}?)" if close else ""


def describe_fields() -> str:
    """Every config key with its default and help, for `--help-config` and docs/cli.md."""
    lines = []
    for section, cls in SECTIONS.items():
        command = "rl" if section == "rl" else "finetune"
        lines.append(f"[{section}]" + (f"    # sheepop {command}" if section in FINETUNE_SECTIONS
                                       else ""))
        for f in fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            lines.append(f"  {section}.{f.name} = {default!r}    # {f.metadata['help']}")
    return "\n".join(lines)
