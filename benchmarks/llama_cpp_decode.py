"""llama.cpp's greedy decode speed on a GGUF file, for benchmarks/weight_dtypes.py to print beside
sheepop's in the same run, when llama-cpp-python is installed.

It is never built here: building llama-cpp-python from source takes ~8 minutes of both cores
(benchmarks/gguf_llama_cpp.py does it, into $SHEEPOP_BENCH_CACHE/llama-cpp, default
~/.cache/sheepop-bench/llama-cpp). `installed()` finds it there or in the environment, or says
why not; the rows are then left out.

    seconds, cpu_seconds = decode_seconds(module, path, ids, new, threads)

llama.cpp evaluates the prompt, then takes `new - 1` greedy steps one token at a time (argmax of
its own logits), timed as sheepop's are (weight_dtypes.decode_seconds: the prompt not counted),
by the clock and by the process's CPU time.

On a CPU with AMX (`amx_int8` in /proc/cpuinfo) llama.cpp's "extra buffer types" are turned off
(`use_extra_bufts`, llama.cpp's --no-extra-bufts; on x86 they are the AMX buffer and the weight
repacking): its AMX product segfaults at the first token on such a machine (measured on the
AVX-512/AMX Xeon of docs/performance.md, llama-cpp-python 0.3.36: `ldtilecfg` in
ggml_backend_amx_mul_mat; llama.cpp issue 20824, pull request 26954). It then runs its
AVX-512 dot products, as on a CPU without AMX.
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import numpy as np

from sheepop.generation.cached_lm import token_loss_sum

CACHE = Path(os.environ.get("SHEEPOP_BENCH_CACHE", Path.home() / ".cache" / "sheepop-bench"))
# sheepop's --dtype -> the GGUF kind llama.cpp runs for it: the same numbers (the NumPy engine's
# int4 blocks are Q4_1's, its int8 blocks Q8_0's, as sheepop's export writes them)
KINDS = {"float32": "f32", "bfloat16": "bf16", "int8": "q8_0", "int4": "q4_1"}


def installed():
    """(the llama_cpp module, "") or (None, why it is not there)."""
    target = CACHE / "llama-cpp"
    if target.is_dir():
        sys.path.append(str(target))
    try:
        import llama_cpp
    except ImportError:
        return None, (f"llama-cpp-python is not installed (benchmarks/gguf_llama_cpp.py builds "
                      f"it into {target}: ~8 min on 2 cores); llama.cpp's rows left out")
    return llama_cpp, ""


def amx() -> bool:
    """Whether this CPU has AMX's int8 tiles (llama.cpp's AMX path; see the module's note)."""
    try:
        return "amx_int8" in Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False


@contextmanager
def without_extra_buffers(module):
    """Models loaded inside get `use_extra_bufts` off: llama-cpp-python's Llama() takes no
    argument for it, so its source of default parameters is wrapped for the while."""
    library = module.llama_cpp
    defaults = library.llama_model_default_params

    def plain():
        params = defaults()
        params.use_extra_bufts = False
        return params

    library.llama_model_default_params = plain
    try:
        yield
    finally:
        library.llama_model_default_params = defaults


def decode_seconds(module, path: Path, ids: list[int], new: int, threads: int
                   ) -> tuple[float, float]:
    """(seconds, CPU seconds of the process) of llama.cpp's `new - 1` greedy decode steps after
    evaluating `ids` (without its extra buffers where the CPU has AMX: `amx`)."""
    # logits_all: llama-cpp-python 0.3 fills `scores` only then (a decode step's one row)
    with without_extra_buffers(module) if amx() else nullcontext():
        llm = module.Llama(model_path=str(path), n_ctx=len(ids) + new + 8, n_threads=threads,
                           n_threads_batch=threads, logits_all=True, verbose=False)
    llm.reset()
    llm.eval(ids)
    token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    started, cpu_started = time.perf_counter(), time.process_time()
    for _ in range(new - 1):
        llm.eval([token])
        token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    llm.close()
    return seconds, cpu_seconds


def loss_sum(module, path: Path, x: np.ndarray, y: np.ndarray, threads: int) -> float:
    """Sum of -ln p(target) over the counted targets of the windows x, y (y < 0: not counted,
    only after a window's counted ones, as sheepop.data.windows.eval_windows cuts them), p from
    llama.cpp's logits: each window evaluated from an empty cache, as sheepop's loss_sum does."""
    with without_extra_buffers(module) if amx() else nullcontext():
        llm = module.Llama(model_path=str(path), n_ctx=x.shape[1] + 8, n_threads=threads,
                           n_threads_batch=threads, logits_all=True, verbose=False)
    total = 0.0
    for row_x, row_y in zip(x, y):
        n = int((row_y >= 0).sum())
        llm.reset()
        llm.eval([int(t) for t in row_x[:n]])
        total += token_loss_sum(np.asarray(llm.scores[:n], np.float64), row_y[:n])
    llm.close()
    return total
