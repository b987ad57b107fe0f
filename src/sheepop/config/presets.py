"""Presets: whole configurations a user starts from (`--preset NAME`); anything can be
overridden after them (`sheepop.config.build.build_config` applies preset, TOML file, `--set`,
flags).

Each is a nested dict of config sections, `{"model": {...}, "train": {...}, "data": {...}}`.
"""

from __future__ import annotations

from typing import Any

PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    # nanoGPT's recipe at a shape that trains in minutes on 2 CPU cores; `sheepop train`'s
    # starting point without --preset (and `make run`'s until `cpu` beat it, docs/speedrun.md).
    "tiny": {
        "model": {"n_layer": 4, "n_head": 4, "n_embd": 128, "block_size": 128, "dropout": 0.0},
        "train": {"steps": 1500, "batch_size": 16, "lr": 2e-3, "min_lr": 2e-4,
                  "warmup_steps": 100, "eval_interval": 250, "eval_batches": 10,
                  "checkpoint_interval": 500},
    },
    # tiny's shape and data with the modern recipe (docs/speedrun.md: each piece a setting with
    # its derivation): rotary positions, RMSNorm, QK-norm, ReLU^2, logit soft-capping,
    # zero-initialised projections, Muon for the blocks' matrices, warmup-stable-decay.
    # benchmarks/cpu_preset.py trains it against tiny for the same wall time: val loss 0.956
    # against 1.222 (docs/speedrun.md, "A preset for the CPU"), so `make run` trains it. Muon's
    # momentum 0.9 (torch's default 0.95) gave a lower loss in 8 seeds of 8 at equal steps.
    "cpu": {
        "model": {"n_layer": 4, "n_head": 4, "n_embd": 128, "block_size": 128, "dropout": 0.0,
                  "pos_encoding": "rope", "norm": "rmsnorm", "qk_norm": True,
                  "activation": "relu2", "logit_softcap": 15.0, "zero_init_proj": True},
        "train": {"steps": 1500, "batch_size": 16, "optimizer": "muon", "muon_lr": 0.02,
                  "muon_momentum": 0.9, "lr": 3e-3, "min_lr": 3e-4, "schedule": "wsd",
                  "cooldown": 0.3, "warmup_steps": 100, "eval_interval": 250, "eval_batches": 10,
                  "checkpoint_interval": 500},
    },
    # tiny with the Llama architecture: rotary positions, RMSNorm, SwiGLU, grouped-query
    # attention (2 key/value heads for 4 query heads), no biases, an untied head. d_ff 384
    # (3d, not the default 8d/3 = 320) brings its parameters to tiny's (within 3%), so the two
    # compare architecture, not size (benchmarks/architectures.py).
    "tiny-llama": {
        "model": {"n_layer": 4, "n_head": 4, "n_kv_head": 2, "n_embd": 128, "d_ff": 384,
                  "block_size": 128, "dropout": 0.0, "pos_encoding": "rope", "norm": "rmsnorm",
                  "ffn": "swiglu", "activation": "silu", "bias": False, "tie_weights": False},
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
    # A Llama-shaped model of GPT-2 small's size (125M parameters with a 32k vocabulary), for
    # GPU users: 12 layers, 12 query and 4 key/value heads, SwiGLU 2048 wide, context 1024.
    "llama-small": {
        "model": {"n_layer": 12, "n_head": 12, "n_kv_head": 4, "n_embd": 768, "d_ff": 2048,
                  "block_size": 1024, "dropout": 0.0, "pos_encoding": "rope", "norm": "rmsnorm",
                  "ffn": "swiglu", "activation": "silu", "bias": False, "tie_weights": False,
                  "ln_eps": 1e-6},
        "train": {"steps": 5000, "batch_size": 12, "grad_accum": 40, "lr": 6e-4, "min_lr": 6e-5,
                  "warmup_steps": 200, "beta2": 0.95, "eval_interval": 500},
        "data": {"tokenizer": "bpe", "vocab_size": 32000},
    },
    # The arithmetic-progression task (sheepop.progression): the classic single-head sketch
    # with positions from the digits (rotary over term indices, digit places with training
    # offsets), which generalises past the training range (docs/progression.md);
    # `sheepop progression train` sets block_size from the digits and the window's terms.
    # One thread: at this size a second one costs more than it gives (docs/progression.md).
    "progression": {
        "model": {"n_layer": 2, "n_head": 1, "n_embd": 64, "block_size": 23, "dropout": 0.0,
                  "pos_encoding": "rope_terms", "digit_positions": 10, "digit_offset": 4,
                  "activation": "relu", "tie_weights": False},
        "train": {"steps": 3000, "batch_size": 128, "lr": 3e-3, "min_lr": 3e-4,
                  "warmup_steps": 100, "eval_interval": 500, "eval_batches": 4,
                  "checkpoint_interval": 2000, "threads": 1},
        "data": {"tokenizer": "digits"},
    },
    # The progression preset before digit positions (sinusoidal positions): the baseline of
    # docs/progression.md's before/after table, with `--directions up`.
    "progression-sinusoidal": {
        "model": {"n_layer": 2, "n_head": 1, "n_embd": 64, "block_size": 23, "dropout": 0.0,
                  "pos_encoding": "sinusoidal", "activation": "relu", "tie_weights": False},
        "train": {"steps": 3000, "batch_size": 128, "lr": 3e-3, "min_lr": 3e-4,
                  "warmup_steps": 100, "eval_interval": 500, "eval_batches": 4,
                  "checkpoint_interval": 2000, "threads": 1},
        "data": {"tokenizer": "digits"},
    },
}
