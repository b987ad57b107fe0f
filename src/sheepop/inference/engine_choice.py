"""`--engine auto`: the engine that measured faster for this model's size, dtype, device and
threads (docs/performance.md, "Which engine auto picks").

The rule, in order:

1. a GPU (device cuda, or auto with a GPU driver present) or torch.compile: torch, the only
   engine that runs them;
2. bfloat16, int8 or int4 weights on the CPU: NumPy, whose compiled kernels read them in their
   own bytes (sheepop.scratch.narrow): on SmolLM2, one thread, 2.2-2.6x torch's eager step and
   1.7-2.7x its compiled one in each dtype (docs/performance.md, "Weights in fewer bytes on the
   NumPy engine"); `--compile` asks for torch's compiled step;
3. float32 on the CPU: the row of `DECODE_TOKENS_PER_S` nearest the model (parameters on a log
   scale) at the thread count in use (above the largest measured, the largest). NumPy if it
   decoded at >= `NUMPY_MARGIN` of torch's rate there, else torch: within 10% NumPy wins on
   what the table does not show, starting ~2 s sooner without importing torch
   (docs/inference.md, "Start-up").

Decode, not prefill, decides: generating is one prefill and many decode steps, and prefill's
rates (in the same benchmark) are 10-40x decode's. The table is this project's machine's (2-core
AMD EPYC, AVX2, OpenBLAS 0.3.31 under NumPy, torch 2.13's MKL): on another CPU the ratio may
differ, so `benchmarks/engine_table.py` prints the rows to put here, and `--engine` names one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

NUMPY_MARGIN = 0.9  # NumPy at >= 0.9 of torch's decode rate: NumPy (it starts ~2 s sooner)
WHERE = "docs/performance.md"


@dataclass(frozen=True)
class Measured:
    """One row of benchmarks/engine_table.py: decode tokens/s of each engine, float32, CPU."""
    shape: str
    params: int
    threads: int
    numpy: float
    torch: float


# benchmarks/engine_table.py --rounds 3 (medians), 2026-11-26 05:34 UTC, on a quiet machine (load
# 1.2-1.4), after the decode layout (sheepop.arch.layout) of both engines.
DECODE_TOKENS_PER_S: tuple[Measured, ...] = (
    Measured("toy", 806_272, 1, 841.5, 521.3),
    Measured("toy", 806_272, 2, 576.5, 319.3),
    Measured("10m", 11_433_984, 1, 208.5, 160.5),
    Measured("10m", 11_433_984, 2, 208.2, 134.3),
    Measured("smollm2", 134_515_008, 1, 23.6, 16.7),
    Measured("smollm2", 134_515_008, 2, 27.5, 17.5),
    Measured("gpt2", 124_439_808, 1, 32.3, 31.2),
    Measured("gpt2", 124_439_808, 2, 45.2, 30.0),
)


@dataclass(frozen=True)
class Choice:
    engine: str
    reason: str

    def line(self) -> str:
        """The start-up line, a note like sheepop's others on stderr: 'sheepop: engine: numpy
        (auto: 135M params at float32 on 2 threads; ...)'."""
        return f"sheepop: engine: {self.engine} (auto: {self.reason})"


def nearest(params: int, threads: int,
            table: tuple[Measured, ...] = DECODE_TOKENS_PER_S) -> Measured:
    """The measured row closest to `params` (on a log scale) at the thread count nearest
    `threads` from below (or the fewest measured)."""
    counts = sorted({row.threads for row in table})
    at = max([c for c in counts if c <= threads] or counts[:1])
    return min((row for row in table if row.threads == at),
               key=lambda row: abs(math.log(row.params / max(params, 1))))


def _size(params: int) -> str:
    return f"{params / 1e6:.0f}M" if params >= 1e7 else f"{params / 1e6:.1f}M"


def choose(params: int | None, on_cpu: bool, dtype: str = "float32", compile: bool = False,
           threads: int = 1, table: tuple[Measured, ...] = DECODE_TOKENS_PER_S) -> Choice:
    """The engine for a model of `params` parameters (None: unknown size) by the rule above."""
    if not on_cpu:
        return Choice("torch", "a GPU: the NumPy engine runs on the CPU only")
    if compile:
        return Choice("torch", "torch.compile runs on the torch engine")
    if dtype != "float32":
        return Choice("numpy", f"{dtype} weights on the CPU: the NumPy engine's kernels read "
                               f"them in their own bytes, {WHERE}")
    if params is None:
        return Choice("numpy", "float32 on the CPU; it starts ~2 s sooner without torch")
    row = nearest(params, threads, table)
    where = (f"{_size(params)} params at float32 on {threads} thread{'s' * (threads != 1)}; "
             f"measured at {row.shape}'s {_size(row.params)}, {row.threads} "
             f"thread{'s' * (row.threads != 1)}")
    ratio = row.numpy / row.torch
    if ratio >= 1:
        return Choice("numpy", f"{where}: numpy decodes {ratio:.1f}x faster, {WHERE}")
    if ratio >= NUMPY_MARGIN:
        return Choice("numpy", f"{where}: numpy decodes at {ratio:.2f}x torch's rate and starts "
                               f"~2 s sooner, {WHERE}")
    return Choice("torch", f"{where}: torch decodes {1 / ratio:.1f}x faster, {WHERE}")

