"""The model shapes the speed benchmarks race the engines on, with random weights, and the timing
loops they share (benchmarks/engine_table.py, bandwidth_bound.py, prefill.py).

Random weights decode at the speed trained ones do: a decode step reads every weight once
whatever its value, and greedy decoding runs the same arithmetic on any numbers. The shapes:

    toy     the `tiny` preset (4 x 128, vocabulary 101): 0.8M parameters
    10m     the `baby` shape (6 x 384) with a 2,048-token vocabulary: 11.4M
    smollm2 SmolLM2-135M's shape (30 x 576, 9 / 3 heads, SwiGLU 1536, vocabulary 49,152, tied)
    gpt2    GPT-2 small's (12 x 768, learned positions, GELU-tanh, vocabulary 50,257, tied): 124M

Bytes read per decoded token (`bytes_per_token`): every weight matrix and vector once, the tied
head reading the embedding table whole, but of an untied embedding table and a learned position
table one row each; plus the KV cache of the context.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np

from sheepop.config.build import build_config
from sheepop.config.model_size import kv_cache_bytes_per_token, param_count
from sheepop.config.schema import Config
from sheepop.inference import load as inference
from sheepop.scratch.init import init_params

SMOLLM2 = ["model.n_layer=30", "model.n_head=9", "model.n_kv_head=3", "model.n_embd=576",
           "model.d_ff=1536", "model.vocab_size=49152", "model.pos_encoding=rope",
           "model.rope_theta=100000", "model.norm=rmsnorm", "model.ffn=swiglu",
           "model.bias=false", "model.tie_weights=true", "model.block_size=1024"]
SHAPES: dict[str, tuple[str, list[str]]] = {
    "toy": ("tiny", ["model.vocab_size=101"]),
    "10m": ("baby", ["model.vocab_size=2048"]),
    "smollm2": ("tiny-llama", SMOLLM2),
    "gpt2": ("gpt2-small", ["model.vocab_size=50257"]),
}


def shape_config(name: str) -> Config:
    preset, overrides = SHAPES[name]
    return build_config(preset, None, [*overrides, "model.dropout=0"])


def bytes_per_token(cfg: Config, context: int = 0, itemsize: int = 4) -> int:
    """Bytes a decode step reads: the weights (module docstring) and `context` tokens' keys
    and values."""
    m = cfg.model
    skipped = 0 if m.tie_weights else (m.vocab_size - 1) * m.n_embd  # one embedding row read
    if m.pos_encoding == "learned":
        skipped += (m.block_size - 1) * m.n_embd
    return itemsize * (param_count(m) - skipped) + context * kv_cache_bytes_per_token(m, itemsize)


def build_models(cfg: Config, engines: list[str], seed: int = 0) -> dict[str, object]:
    """{engine: its CachedLM} on the same random weights."""
    weights = init_params(cfg.model, seed)
    return {e: inference.build(cfg, weights, None, e, device="cpu").lm for e in engines}


def decode_seconds(lm, prompt: list[int], new: int) -> tuple[float, list[int]]:
    """(seconds of the `new - 1` decode steps after the prompt's prefill, greedy tokens)."""
    token = int(np.argmax(lm.prefill(prompt)))
    out, t0 = [token], time.perf_counter()
    for _ in range(new - 1):
        token = int(np.argmax(lm.decode(token)))
        out.append(token)
    return time.perf_counter() - t0, out


def prefill_seconds(lm, prompt: list[int]) -> float:
    t0 = time.perf_counter()
    lm.prefill(prompt)
    return time.perf_counter() - t0


def alternate(contenders: dict[str, Callable[[], float]], rounds: int) -> dict[str, float]:
    """Each contender's median seconds over `rounds`, the contenders taking turns (the order
    reversed every other round, so neither always follows the other)."""
    times: dict[str, list[float]] = {name: [] for name in contenders}
    names = list(contenders)
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            times[name].append(contenders[name]())
    return {name: statistics.median(t) for name, t in times.items()}


def prompt_ids(vocab: int, length: int, seed: int = 1) -> list[int]:
    return np.random.default_rng(seed).integers(0, vocab, length).tolist()
