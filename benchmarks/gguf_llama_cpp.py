"""sheepop's GGUF exports in llama.cpp itself: does each kind load, tokenize as sheepop does, and
give sheepop's next-token probabilities?

    .venv/bin/python benchmarks/gguf_llama_cpp.py --work runs/gguf-llama-cpp \\
        --out runs/gguf-llama-cpp/figures.json

1. llama.cpp  the PyPI package `llama-cpp-python` (LLAMA_CPP_VERSION), built from source once
              into CACHE/llama-cpp (`pip install --target`; ~8 min on 2 cores; CACHE is
              $SHEEPOP_BENCH_CACHE, default ~/.cache/sheepop-bench). Its build is for the CPU it
              is built on (GGML_NATIVE); give CMAKE_ARGS="-DGGML_NATIVE=OFF" for a cache shared
              by other CPUs. The folder goes after the virtualenv's own on sys.path, so the
              virtualenv's NumPy is the one imported.
2. models     (a) a tiny-llama run with a bpe tokenizer trained here (`sheepop train --preset
              tiny-llama --tokenizer bpe`, the default data: the standard library's source, a
              few steps: the figures compare engines, not a good model); (b) SmolLM2-135M-
              Instruct imported from its GGUF (tests/helpers/real_model.py fetches the file).
3. per kind   `sheepop export --to gguf --gguf-type f32|f16|bf16|q8_0`; llama.cpp loads the
              file (Llama(logits_all=True), its defaults otherwise: f16 KV cache); TEXTS are
              tokenized by both (llama.cpp with special tokens parsed, no BOS added) and must
              give the same ids; then llama.cpp's probabilities at every position of each text
              against sheepop's torch engine in float32, on the run itself ("vs run": the
              weights' rounding and llama.cpp's arithmetic) and on the file imported back into
              sheepop ("vs file": llama.cpp's arithmetic only), as the largest |p - p'| over the
              vocabulary and the positions (and of the logits |z - z'| against the file), and
              at how many positions the most likely next token is the same as on the run; and
              against the file again with llama.cpp's KV cache in float32 (its default, f16,
              rounds every key and value).

Figures go to standard output and, with `--out`, to a JSON file.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import machine
import numpy as np

LLAMA_CPP_VERSION = "0.3.36"
KINDS = ("f32", "f16", "bf16", "q8_0")
TEXTS = ("The capital of France is",
         "def add(a, b):\n    return a + b\n\n\nclass Point:\n    x: int = 0\n",
         "In 2024, 1,234,567 people came; it's 3.14 o'clock -- WE'VE paid $42!",
         "Naïve café owners in Zürich serve crème brûlée. 😀 漢字 Привет\t\ttabs  ",
         "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")
ROOT = Path(__file__).resolve().parents[1]


def llama_cpp(cache: Path):
    """The llama_cpp module from `cache`/llama-cpp, installed there first when it is not."""
    target = cache / "llama-cpp"
    sys.path.append(str(target))
    try:
        import llama_cpp as module
        if module.__version__ == LLAMA_CPP_VERSION:
            return module
    except ImportError:
        pass
    print(f"installing llama-cpp-python {LLAMA_CPP_VERSION} into {target} (built from "
          "source: ~8 min on 2 quiet cores, once)", flush=True)
    env = {**os.environ, "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 1)}
    subprocess.run(["nice", "-n", "10", sys.executable, "-m", "pip", "install", "-q",
                    "--no-deps", "--upgrade", "--target", str(target),
                    f"llama-cpp-python=={LLAMA_CPP_VERSION}", "diskcache"], check=True, env=env)
    sys.modules.pop("llama_cpp", None)
    importlib.invalidate_caches()
    import llama_cpp as module
    return module


def sheepop(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "sheepop", *args], check=True)


def tiny_run(work: Path, steps: int) -> Path:
    run = work / "tiny-llama"
    if not (run / "model.safetensors").is_file():
        t0 = time.perf_counter()
        sheepop("train", "--preset", "tiny-llama", "--tokenizer", "bpe", "--vocab-size", "1024",
                "--steps", str(steps), "--out", str(run))
        print(f"trained {run} in {time.perf_counter() - t0:.0f} s", flush=True)
    return run


def smollm2_run(work: Path) -> Path | None:
    sys.path.insert(0, str(ROOT / "tests" / "helpers"))
    from real_model import smollm2_gguf
    gguf, why = smollm2_gguf()
    if gguf is None:
        print(f"SmolLM2 skipped: {why}")
        return None
    run = work / "smollm2"
    if not (run / "model.safetensors").is_file():
        sheepop("import", str(gguf), str(run))
    return run


def sheepop_logits(run: Path, texts: list[list[int]]) -> list[np.ndarray]:
    """Next-token logits (T, V) of each id list, sheepop's torch engine in float32."""
    import torch

    from sheepop.inference.load import read_run, torch_gpt
    config, _, weights = read_run(run)
    model = torch_gpt(config.model, weights).eval()
    with torch.no_grad():
        return [model(torch.tensor([ids]))[0][0].double().numpy() for ids in texts]


def softmax(logits: np.ndarray) -> np.ndarray:
    """p_i = exp(z_i - max z) / sum_j exp(z_j - max z), row by row, in float64."""
    z = np.asarray(logits, dtype=np.float64)
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def load_in_llama_cpp(module, path: Path, n_ctx: int, **options):
    """(the Llama object, "") or (None, llama.cpp's reason) when it refuses the file."""
    kw = dict(model_path=str(path), n_ctx=n_ctx, n_batch=n_ctx, logits_all=True,
              n_threads=os.cpu_count() or 1, seed=0, **options)
    try:
        return module.Llama(verbose=False, **kw), ""
    except Exception as e:  # noqa: BLE001 (llama-cpp-python raises ValueError or RuntimeError)
        print(f"llama.cpp refused {path.name}: {e}; again with its log:", flush=True)
        try:
            module.Llama(verbose=True, **kw)
        except Exception as again:  # noqa: BLE001
            return None, str(again)
        return None, str(e)


def compare(module, run: Path, kind: str, work: Path) -> dict:
    """Export `run` as `kind`, load it in llama.cpp, compare ids and probabilities."""
    from sheepop.inference.load import read_run
    path = work / f"{run.name}-{kind}.gguf"
    t0 = time.perf_counter()
    sheepop("export", str(run), str(path), "--to", "gguf", "--gguf-type", kind, "--overwrite")
    row = {"model": run.name, "kind": kind, "mib": path.stat().st_size / 2**20,
           "export_s": time.perf_counter() - t0}
    _, tokenizer, _ = read_run(run)
    ours = [tokenizer.encode(t) for t in TEXTS]
    llm, why = load_in_llama_cpp(module, path, n_ctx=max(map(len, ours)) + 8)
    row["loads"] = llm is not None
    if llm is None:
        return {**row, "refusal": why}
    theirs = [llm.tokenize(t.encode("utf-8"), add_bos=False, special=True) for t in TEXTS]
    row["texts_same_ids"] = sum(a == b for a, b in zip(ours, theirs))
    row["texts"] = len(TEXTS)
    row["ids_differ"] = [[t, a, b] for t, a, b in zip(TEXTS, ours, theirs) if a != b]
    logits = llama_logits(llm, ours)
    del llm
    f32_cache, _ = load_in_llama_cpp(module, path, n_ctx=max(map(len, ours)) + 8,
                                     type_k=module.GGML_TYPE_F32, type_v=module.GGML_TYPE_F32)
    logits_f32_cache = llama_logits(f32_cache, ours)
    del f32_cache
    probs = [softmax(z) for z in logits]
    back = work / f"{run.name}-{kind}-imported"
    sheepop("import", "--overwrite", str(path), str(back))
    for name, reference in (("vs_run", run), ("vs_file", back)):
        expected_logits = sheepop_logits(reference, ours)
        expected = [softmax(z) for z in expected_logits]
        row[f"max_dz_{name}"] = max(float(np.abs(z - y).max())
                                    for z, y in zip(logits, expected_logits))
        row[f"max_dp_{name}"] = max(float(np.abs(p - q).max()) for p, q in zip(probs, expected))
        if name == "vs_file":  # llama.cpp's arithmetic without its f16 KV cache's rounding
            row["max_dz_vs_file_f32_kv"] = max(float(np.abs(z - y).max()) for z, y in
                                               zip(logits_f32_cache, expected_logits))
            row["max_dp_vs_file_f32_kv"] = max(float(np.abs(softmax(z) - q).max()) for z, q in
                                               zip(logits_f32_cache, expected))
        row[f"argmax_same_{name}"] = sum(int((p.argmax(-1) == q.argmax(-1)).sum())
                                         for p, q in zip(probs, expected))
    row["positions"] = sum(map(len, ours))
    return row


def llama_logits(llm, texts: list[list[int]]) -> list[np.ndarray]:
    """llama.cpp's logits (T, V) at every position of each id list, one evaluation each."""
    logits = []
    for ids in texts:
        llm.reset()
        llm.eval(ids)
        logits.append(np.array(llm.scores[:len(ids)], dtype=np.float64))
    return logits


def table(rows: list[dict]) -> str:
    head = (f"{'model':<11} {'kind':<5} {'MiB':>7} {'loads':>5} {'same ids':>8} "
            f"{'max|dp| vs run':>15} {'vs file':>9} {'max|dz| vs file':>15} "
            f"{'f32 KV: max|dp|':>15} {'max|dz|':>9} {'same top-1':>10}")
    lines = [head, "-" * len(head)]
    for r in rows:
        if not r["loads"]:
            lines.append(f"{r['model']:<11} {r['kind']:<5} {r['mib']:>7.1f} {'no':>5}  "
                         f"{r['refusal'][:60]}")
            continue
        lines.append(f"{r['model']:<11} {r['kind']:<5} {r['mib']:>7.1f} {'yes':>5} "
                     f"{r['texts_same_ids']:>4}/{r['texts']:<3} {r['max_dp_vs_run']:>15.1e} "
                     f"{r['max_dp_vs_file']:>9.1e} {r['max_dz_vs_file']:>15.1e} "
                     f"{r['max_dp_vs_file_f32_kv']:>15.1e} {r['max_dz_vs_file_f32_kv']:>9.1e} "
                     f"{r['argmax_same_vs_run']:>5}/{r['positions']:<4}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("runs/gguf-llama-cpp"))
    ap.add_argument("--cache", type=Path, default=Path(os.environ.get(
        "SHEEPOP_BENCH_CACHE", Path.home() / ".cache" / "sheepop-bench")))
    ap.add_argument("--steps", type=int, default=60, help="the tiny run's training steps")
    ap.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    ap.add_argument("--no-smollm2", action="store_true")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    described = machine.describe()
    print(machine.summary(described), flush=True)
    module = llama_cpp(args.cache)
    from importlib import metadata

    import torch
    versions = {"llama-cpp-python": module.__version__, "gguf": metadata.version("gguf"),
                "torch": torch.__version__, "sheepop": subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
            text=True).stdout.strip()}
    print("versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()), flush=True)
    args.work.mkdir(parents=True, exist_ok=True)
    runs = [tiny_run(args.work, args.steps)]
    if not args.no_smollm2:
        runs += [r for r in [smollm2_run(args.work)] if r is not None]
    rows = []
    for run in runs:
        for kind in args.kinds:
            rows.append(compare(module, run, kind, args.work))
            print(table(rows[-1:]).splitlines()[-1], flush=True)
    print()
    print(table(rows))
    for r in rows:
        for text, ours, theirs in r.get("ids_differ", []):
            print(f"{r['model']} {r['kind']}: {text!r}: sheepop {ours} llama.cpp {theirs}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"machine": described, "versions": versions,
                                        "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
