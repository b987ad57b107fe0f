"""Weights in fewer bytes, measured: SmolLM2-135M in float32, bfloat16, int8 and int4, each on the
eager decode step and on `--compile`'s, beside llama.cpp's on the same format.

    python benchmarks/weight_dtypes.py                              # imports SmolLM2 first
    python benchmarks/weight_dtypes.py --run /tmp/smol --threads 1 2 --repeats 5
    python benchmarks/weight_dtypes.py --random-weights --threads 1 --repeats 3   # speed only

It prints the machine first (machine.summary: the CPU, torch's CPU capability, the BLAS
kernels, the load). For each `--dtype` of the torch engine (sheepop.inference.load.build; int8:
sheepop.model.quantized; int4, 4-bit groups in GGUF Q4_1's layout: sheepop.model.quantized_int4,
after checking that the imported float32 weights give back the file's own Q4_1 blocks) it
prints:

- decode tokens/s at each `--threads`, on each `--paths`: `plain` (the eager step),
  `compiled` (TorchLM.compile, `--compile`: one block's graph for every layer, built and
  compiled at that thread count, its time printed) and `numpy` (the NumPy engine, narrow
  matrices through sheepop.scratch.narrow's compiled kernels: what `--engine auto` runs every
  dtype with on a CPU); greedy decoding of `--new-tokens`
  tokens after a `--prompt-tokens`-token prompt, one token a step through the KV cache; every
  model takes its turn, `--repeats` times (the order reversed every other round), and the
  median of each is printed, with compiled / plain and the load average before and after;
  by the clock and by the process's CPU time (the ratios are CPU time's: on a core others
  share, the clock counts their turns too);
- the bound: the machine's read bandwidth (a `--bandwidth-mib` array read on the same threads
  by bandwidth_bound.py's readers, the fastest, median of 5) over the bytes of weights one
  decode step reads in that dtype (sheepop.model.quantized.weight_bytes_read: every matrix,
  norm and bias, the token embedding only where the head reads it); tokens/s as a fraction of
  it;
- llama.cpp's tokens/s on the same format in the same run, taking its turn in the rounds
  (llama_cpp_decode: the file's own
  Q4_1 for int4, `sheepop export --to gguf` q8_0 / bf16 / f32 of the run for the others), when
  llama-cpp-python is installed (never built by this script: benchmarks/gguf_llama_cpp.py
  builds it, ~8 min on 2 cores); otherwise it says so and leaves those columns empty;
- bits per byte on held-out text (`--text`, by default this repository's docs/inference.md,
  written after SmolLM2 was trained): windows of `--window` tokens, the first `--bpb-tokens`
  of the text, scored by the same model as `sheepop eval` does (loss_sum, TargetBytes; the
  prompt path, eager on both paths), and by llama.cpp on its file of each format (its logits
  over the same windows, llama_cpp_decode.loss_sum) when it is installed;
- peak memory: the peak resident set (the kernel's ru_maxrss, through os.wait4) of a fresh
  `sheepop generate RUN --dtype D --max-new-tokens --peak-tokens` process per dtype and path,
  greedy, the torch engine, and float32 on the NumPy engine too (`auto`'s choice there),
  loading included: what a user's command holds at its worst (`--peak-tokens 0` skips it).

The weights are SmolLM2's GGUF (Q4_1 blocks) dequantized to float32 by `sheepop import`: that
float32 model is the reference the others are compared with (`--random-weights`: SmolLM2's
shape with random weights, decode_shapes; a decode step reads every weight whatever its value,
so the speed is the real model's). Targets (issues 31, 47): bfloat16 within 0.002 bits/byte of
float32, int8 within 0.01; each decode at >= 0.8 of its own bound; int4 >= llama.cpp's Q4_1,
int8 >= its Q8_0.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import llama_cpp_decode
import machine
import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "helpers"))

from bandwidth_bound import read_rates  # noqa: E402  (this folder: the same readers)
from decode_shapes import prompt_ids, shape_config  # noqa: E402
from real_model import smollm2_gguf  # noqa: E402

from sheepop import threads  # noqa: E402
from sheepop.arch.quantize import quantize_groups, quantize_q8_0  # noqa: E402
from sheepop.data.windows import eval_windows  # noqa: E402
from sheepop.inference.load import build, read_run  # noqa: E402
from sheepop.model.quantized import weight_bytes_read  # noqa: E402
from sheepop.scratch.init import init_params  # noqa: E402
from sheepop.tokenizers.token_bytes import TargetBytes, bits_per_byte  # noqa: E402

DTYPES = ("float32", "bfloat16", "int8", "int4")
# GGUF names of the matrices whose rows the import keeps in order (q and k are permuted back)
IN_ORDER = {"ffn_gate": "ffn.gate", "ffn_up": "ffn.up", "ffn_down": "ffn.proj",
            "attn_output": "attn.proj"}
PROMPT = ("The history of the printing press begins in the fifteenth century, when Johannes "
          "Gutenberg combined movable metal type, oil-based ink and a screw press. ")


def read_bandwidth(mib: int, repeats: int = 5) -> float:
    """Bytes/s of reading a `mib` MiB float32 array once, far larger than the caches: the
    fastest of bandwidth_bound's readers (torch.sum, NumPy's sum, a BLAS matrix-vector
    product, on the threads set), each the median of `repeats` reads after one warm-up."""
    a = np.ones(mib * 2 ** 20 // 4096 * 1024, dtype=np.float32)
    t = torch.from_numpy(a)
    read_rates(a, t)
    rates = [read_rates(a, t) for _ in range(repeats)]
    return max(statistics.median(r[name] for r in rates) for name in rates[0])


def print_machine(args) -> None:
    """The machine's line, and the target the NumPy engine's 8-bit kernels compile for."""
    print(f"machine: {machine.summary()}")
    if {"int8", "int4"} & set(args.dtypes) and "numpy" in args.paths:
        from numba.core import config as numba_config

        from sheepop.scratch.row_dot import compiles_for_avx2
        print(f"NumPy engine's 8-bit kernels: {'AVX2' if compiles_for_avx2() else 'portable'} "
              f"sums, compiled for {numba_config.CPU_NAME or 'this CPU'} (NUMBA_CPU_NAME and "
              f"NUMBA_CPU_FEATURES choose another)")


def blocks_recovered(gguf: Path, weights: dict) -> dict[str, tuple[int, int]]:
    """How many blocks of the file's row-ordered matrices sheepop's quantizers give back
    exactly from the imported float32 weights: Q4_1's (q, low and d: quantize_groups, int4's
    blocks) and Q8_0's (q and d: quantize_q8_0, int8's and int4's head), {type: (equal, all)}."""
    from gguf import GGUFReader
    counts = {"Q4_1": (0, 0), "Q8_0": (0, 0)}
    for t in GGUFReader(str(gguf)).tensors:
        layer, _, kind = t.name.removeprefix("blk.").rpartition(".weight")[0].partition(".")
        kind_of = t.tensor_type.name
        name = ("tok_emb.weight" if t.name == "token_embd.weight"
                else f"blocks.{layer}.{IN_ORDER[kind]}.weight" if kind in IN_ORDER else None)
        if kind_of not in counts or name is None:
            continue
        if kind_of == "Q4_1":
            raw = np.asarray(t.data).reshape(-1, 20)  # a block: d, m (float16), 16 bytes of q
            d = raw[:, 0:2].copy().view(np.float16).astype(np.float32)[:, 0]
            low = raw[:, 2:4].copy().view(np.float16).astype(np.float32)[:, 0]
            q = np.concatenate([raw[:, 4:] & 15, raw[:, 4:] >> 4], axis=1)
            q2, d2, low2 = quantize_groups(weights[name])
            same = ((q2.reshape(-1, 32) == q).all(axis=1) & (low2.ravel() == low)
                    & (d2.ravel() == d))
        else:
            raw = np.asarray(t.data).reshape(-1, 34)  # a block: d (float16), 32 int8 of q
            q2, d2 = quantize_q8_0(weights[name])
            same = ((q2.reshape(-1, 32).view(np.uint8) == raw[:, 2:]).all(axis=1)
                    & (d2.reshape(-1, 1).view(np.uint8) == raw[:, :2]).all(axis=1))
        equal, total = counts[kind_of]
        counts[kind_of] = equal + int(same.sum()), total + len(same)
    return counts


def decode_seconds(lm, ids: list[int], new: int) -> tuple[float, float, list[int]]:
    """(seconds, CPU seconds of the process, tokens) of `new - 1` greedy decode steps after the
    prompt (the prefill not counted)."""
    token = int(np.argmax(lm.prefill(ids)))
    out, t0, c0 = [token], time.perf_counter(), time.process_time()
    for _ in range(new - 1):
        token = int(np.argmax(lm.decode(token)))
        out.append(token)
    return time.perf_counter() - t0, time.process_time() - c0, out


def peak_rss(run: Path, dtype: str, engine: str, new_tokens: int, threads_used: int,
             compiled: bool = False) -> int:
    """Bytes: the peak resident set of one `sheepop generate` of `new_tokens` greedy tokens
    (`--compile` if `compiled`), the process's own (os.wait4 reports that child's ru_maxrss,
    in KiB on Linux; inductor's compiler processes are not counted)."""
    command = [sys.executable, "-m", "sheepop", "generate", str(run), "--prompt", PROMPT,
               "--max-new-tokens", str(new_tokens), "--temperature", "0", "--dtype", dtype,
               "--engine", engine, "--device", "cpu", "--threads", str(threads_used),
               *(["--compile"] if compiled else [])]
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode:
        sys.exit(f"{' '.join(command)} failed: {child.stderr.read().decode()[-2000:]}")
    return usage.ru_maxrss * 1024


def print_peaks(run: Path, dtypes: list[str], new_tokens: int, threads_used: int,
                paths: list[str]) -> None:
    print(f"\npeak resident memory of `sheepop generate --max-new-tokens {new_tokens}` "
          f"(greedy, {threads_used} thread(s)), one fresh process each:")
    rows = [(d, "numpy", False) for d in dtypes if "numpy" in paths]
    rows += [(d, "torch", False) for d in dtypes if "plain" in paths]
    rows += [(d, "torch", True) for d in dtypes if "compiled" in paths]
    for dtype, engine, compiled in rows:
        peak = peak_rss(run, dtype, engine, new_tokens, threads_used, compiled)
        print(f"{dtype:<9} {engine:<6} {'--compile' if compiled else '':<9} {peak / 1e9:.3f} GB")


def gguf_files(run: Path, gguf: Path, dtypes: list[str]):
    """(llama_cpp, {dtype: the GGUF file llama.cpp runs for it}) when llama-cpp-python is
    installed: int4 the file itself (its Q4_1 blocks), the others `sheepop export`s of the run
    (llama_cpp_decode.KINDS); None (and why) when it is not."""
    module, why = llama_cpp_decode.installed()
    if module is None:
        print(why)
        return None
    folder = Path(tempfile.mkdtemp(prefix="sheepop-gguf-"))
    files = {}
    for dtype in dtypes:
        kind = llama_cpp_decode.KINDS[dtype]
        files[dtype] = gguf if kind == "q4_1" else folder / f"smollm2-{kind}.gguf"
        if kind != "q4_1":
            subprocess.run([sys.executable, "-m", "sheepop", "export", str(run),
                            str(files[dtype]), "--to", "gguf", "--gguf-type", kind,
                            "--overwrite"], check=True, stdout=subprocess.DEVNULL)
    return module, files


def speed_table(config, weights, tokenizer, ids: list[int], n: int, args, llama) -> None:
    """At `n` threads, each dtype's decode tokens/s on each path (`--paths`: eager, `--compile`'s,
    compiled here at n threads: inductor's C++ is specialised to the thread count, and for
    float32 the NumPy engine, `auto`'s choice there), and llama.cpp's on the same format where
    it is installed (`llama`), all taking turns (the order reversed every other round),
    medians; against its bound. Rates by the clock and by the process's CPU time: on a shared
    core the clock counts the others' turns too, CPU time only this process's own work."""
    threads.apply(n)
    runs, nbytes = {}, {}
    for d in args.dtypes:
        for path in args.paths:
            t0 = time.perf_counter()
            engine = "numpy" if path == "numpy" else "torch"
            lm = build(config, weights, tokenizer, engine, "cpu", d, path == "compiled").lm
            if path == "compiled":
                print(f"{d}: built and compiled at {n} thread(s) in "
                      f"{time.perf_counter() - t0:.1f} s", flush=True)
            nbytes[d, path] = (weight_bytes_read(lm.model) if engine == "torch"
                               else numpy_bytes_read(lm))
            runs[d, path] = lambda lm=lm: decode_seconds(lm, ids, args.new_tokens)
    if llama is not None:
        for d, f in llama[1].items():
            runs[d, "llama.cpp"] = lambda f=f: (*llama_cpp_decode.decode_seconds(
                llama[0], f, ids, args.new_tokens, n), None)
    load_before = os.getloadavg()[0]
    bandwidth = read_bandwidth(args.bandwidth_mib)
    wall: dict[tuple[str, str], list[float]] = {k: [] for k in runs}
    cpu: dict[tuple[str, str], list[float]] = {k: [] for k in runs}
    tokens: dict[tuple[str, str], list[int]] = {}
    for r in range(args.repeats):
        for key in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
            seconds, cpu_seconds, tokens[key] = runs[key]()
            wall[key].append((args.new_tokens - 1) / seconds)
            cpu[key].append((args.new_tokens - 1) / cpu_seconds)
    print(f"\n{n} thread(s): read bandwidth {bandwidth / 1e9:.2f} GB/s (by the clock: the "
          f"bound and 'of bound' are the clock's); load average "
          f"{load_before:.2f} -> {os.getloadavg()[0]:.2f}; decode {args.new_tokens} "
          f"greedy tokens after {len(ids)}, median of {args.repeats}; tok/s by the clock, "
          "tok/cpu-s by the process's CPU time (the ratios: by CPU time)")
    print(f"{'dtype':<9} {'path':<9} {'MB/token':>8} {'bound':>6} {'tok/s':>6} "
          f"{'tok/cpu-s':>9} {'of bound':>8} {'vs plain':>8} {'vs llama':>8} "
          f"{'vs f32':>6}  {'all runs (cpu)':<24} greedy tokens vs float32's")
    best_f32 = max((statistics.median(v) for (d, path), v in cpu.items()
                    if d == "float32" and path != "llama.cpp"), default=None)
    for (d, path), rates_seen in cpu.items():
        med, clock = statistics.median(rates_seen), statistics.median(wall[d, path])
        ours = path != "llama.cpp"
        # the bound is the clock's (the bandwidth read by the clock): against the clock's rate
        bound = bandwidth / nbytes[d, path] if ours else None
        plain = cpu.get((d, "plain"))
        ratio = f"{med / statistics.median(plain):.2f}x" if plain and ours else "-"
        theirs = cpu.get((d, "llama.cpp"))
        versus = f"{med / statistics.median(theirs):.2f}" if theirs and ours else "-"
        f32 = f"{med / best_f32:.2f}" if best_f32 and ours else "-"
        runs_seen = " ".join(f"{v:.1f}" for v in rates_seen)
        ref = tokens.get(("float32", path))
        same = ("-" if ref is None or tokens[d, path] is None else
                f"{sum(a == b for a, b in zip(tokens[d, path], ref))} of {args.new_tokens} equal")
        print(f"{d:<9} {path:<9} {nbytes.get((d, path), 0) / 1e6:>8.1f} "
              f"{'-' if bound is None else f'{bound:.1f}':>6} "
              f"{clock:>6.1f} {med:>9.1f} "
              f"{'-' if bound is None else f'{clock / bound:.2f}':>8} {ratio:>8} {versus:>8} "
              f"{f32:>6}  {runs_seen:<24} {same}")
    if best_f32:
        print("(vs f32: tok/cpu-s over float32's fastest sheepop path's; vs llama: over "
              "llama.cpp's on the same format)")


def numpy_bytes_read(lm) -> int:
    """What one decode step of the NumPy engine reads: every parameter in the bytes it is held
    in (a narrow matrix's own, sheepop.scratch.narrow), but the token table's when the head
    does not read it (a lookup reads one row) and a learned position table's (the same)."""
    tied = "head.weight" not in lm.params
    return sum(w.nbytes for name, w in lm.params.items()
               if name not in (() if tied else ("tok_emb.weight",)) + ("pos_emb.weight",))


def bits_per_byte_of(model, x: np.ndarray, y: np.ndarray, n_bytes: int) -> float:
    total = sum(model.loss_sum(x[i:i + 1], y[i:i + 1])[0] for i in range(len(x)))
    return bits_per_byte(total, n_bytes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, help="an imported SmolLM2 run (default: import now)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1])
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--prompt-tokens", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--text", type=Path, default=ROOT / "docs" / "inference.md")
    ap.add_argument("--bpb-tokens", type=int, default=1024)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--bandwidth-mib", type=int, default=512)
    ap.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=DTYPES)
    ap.add_argument("--peak-tokens", type=int, default=200,
                    help="tokens each peak-memory process generates (0: no peak memory)")
    ap.add_argument("--only-peaks", action="store_true", help="measure peak memory only")
    ap.add_argument("--paths", nargs="+", default=["plain", "compiled", "numpy"],
                    choices=["plain", "compiled", "numpy"],
                    help="the eager decode step, --compile's (TorchLM.compile), and the NumPy "
                         "engine")
    ap.add_argument("--random-weights", action="store_true",
                    help="SmolLM2's shape with random weights: decode speed only (no file, no "
                         "peaks, no bits per byte, no llama.cpp)")
    args = ap.parse_args()

    run = args.run
    gguf, why = smollm2_gguf()
    if args.random_weights:
        print_machine(args)
        config = shape_config("smollm2")
        weights = init_params(config.model, 0)
        ids = prompt_ids(config.model.vocab_size, args.prompt_tokens)
        for n in args.threads:
            speed_table(config, weights, None, ids, n, args, None)
        return
    if run is None:
        if gguf is None:
            sys.exit(f"no model: {why}")
        from sheepop.interop.gguf import import_gguf
        run = Path(tempfile.mkdtemp(prefix="sheepop-bench-")) / "smollm2"
        import_gguf(gguf, run)
    print_machine(args)
    if args.peak_tokens:
        print_peaks(run, args.dtypes, args.peak_tokens, args.threads[0], args.paths)
    if args.only_peaks:
        return
    config, tokenizer, weights = read_run(run)
    if gguf is not None and {"int8", "int4"} & set(args.dtypes):
        counts = blocks_recovered(gguf, weights)
        print(f"blocks of {gguf.name} given back from the imported float32 weights: Q4_1 "
              f"(quantize_groups; ffn and attention output matrices) {counts['Q4_1'][0]} of "
              f"{counts['Q4_1'][1]}, Q8_0 (quantize_q8_0; the token table, int8's head) "
              f"{counts['Q8_0'][0]} of {counts['Q8_0'][1]}")
    ids = tokenizer.encode(PROMPT * 4)[:args.prompt_tokens]
    llama = gguf_files(run, gguf, args.dtypes) if gguf is not None else None
    for n in args.threads:
        speed_table(config, weights, tokenizer, ids, n, args, llama)
    models = {(d, "torch"): build(config, weights, tokenizer, "torch", "cpu", d)
              for d in args.dtypes}
    models |= {(d, "numpy"): build(config, weights, tokenizer, "numpy", "cpu", d)
               for d in args.dtypes if d != "float32"}

    text = args.text.read_text(encoding="utf-8")
    stream = np.asarray(tokenizer.encode(text)[:args.bpb_tokens + 1])
    pad = tokenizer.pad_id if tokenizer.pad_id is not None else 0
    x, y = eval_windows(stream, args.window, 10 ** 6, pad)
    n_bytes = TargetBytes(tokenizer).count(x, y)
    shown = args.text.relative_to(ROOT) if args.text.is_relative_to(ROOT) else args.text
    print(f"\nbits per byte on {shown}: "
          f"{int((y >= 0).sum())} tokens, {n_bytes} bytes, windows of {args.window}")
    bpb = {}
    for (d, engine), m in models.items():
        t0 = time.perf_counter()
        bpb[d, engine] = bits_per_byte_of(m, x, y, n_bytes)
        f32 = bpb.get(("float32", "torch"))
        gap = "" if f32 is None else f"  ({bpb[d, engine] - f32:+.4f} vs float32)"
        print(f"{d:<9} {engine:<6} {bpb[d, engine]:.4f} bits/byte{gap}   "
              f"[{time.perf_counter() - t0:.0f} s]")
    if llama is not None:  # llama.cpp on its own file of each format, the same windows
        module, files = llama
        for d in args.dtypes:
            t0 = time.perf_counter()
            value = bits_per_byte(llama_cpp_decode.loss_sum(module, files[d], x, y,
                                                            args.threads[0]), n_bytes)
            f32 = bpb.get(("float32", "torch"))
            gap = "" if f32 is None else f"  ({value - f32:+.4f} vs float32)"
            print(f"{d:<9} {'llama.cpp':<9} {value:.4f} bits/byte{gap} "
                  f"({llama_cpp_decode.KINDS[d]})   [{time.perf_counter() - t0:.0f} s]")


if __name__ == "__main__":
    main()
