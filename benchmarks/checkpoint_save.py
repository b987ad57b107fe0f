"""Saving a checkpoint of a real model's size: sheepop's writer against the reference serializer.

    python benchmarks/checkpoint_save.py                    # SmolLM2-135M's shapes, 3 rounds
    python benchmarks/checkpoint_save.py --rounds 5 --dir /some/disk

A checkpoint of SmolLM2-135M-shaped random weights (134.5M float32 parameters, 212 tensors)
and an AdamW state for it (two float32 arrays per parameter and torch's 5 kB RNG state), saved
the way a training run saves it (`sheepop.checkpoint.format.save_checkpoint`: staged, fsynced,
committed, installed; the SHA-256 of both weight files recorded) into `--dir`, two ways in turn
`--rounds` times:

- sheepop: `safetensors_parts` (sheepop.checkpoint.tensor_file), each file written from its
  parts with one writev, no copy;
- reference: each safetensors file's bytes made by `safetensors.numpy.save` (the Rust
  serializer, as sheepop wrote them until 2026-11-26), then written the same way.

Printed: the median seconds of each save and of its serialization alone, the load average and
the bytes written. Both write the same tensors; the files differ only in the order of the
tensors inside them (the reference sorts them).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import machine
import numpy as np
from safetensors.numpy import save as reference_save

from sheepop.checkpoint import format as checkpoint
from sheepop.config.build import build_config
from sheepop.scratch.init import init_params


def smollm2_arrays() -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    cfg = build_config(None, None, [
        "model.vocab_size=49152", "model.block_size=2048", "model.n_layer=30", "model.n_head=9",
        "model.n_kv_head=3", "model.n_embd=576", "model.d_ff=1536", "model.pos_encoding=rope",
        "model.norm=rmsnorm", "model.ffn=swiglu", "model.activation=silu", "model.bias=false",
        "model.tie_weights=true", "model.dropout=0"])
    weights = init_params(cfg.model, np.random.default_rng(0))
    trainer = {f"{kind}.{name}": np.full_like(w, 0.5) for name, w in weights.items()
               for kind in ("exp_avg", "exp_avg_sq")}
    trainer["rng.torch"] = np.arange(5056, dtype=np.uint8)
    return weights, trainer


CONFIG = {"format": checkpoint.FORMAT, "version": checkpoint.VERSION}


def sheepop_files(weights, trainer) -> dict:
    return checkpoint.checkpoint_files(weights, CONFIG, "{}", trainer, {"step": 1})


def reference_files(weights, trainer) -> dict:
    """The same files as sheepop wrote them before: each weight file's bytes in one buffer."""
    files = checkpoint.checkpoint_files({}, CONFIG, "{}")  # config and tokenizer
    model = reference_save(weights, metadata={"format": checkpoint.FORMAT})
    state = reference_save(trainer)
    files.update({checkpoint.MODEL_FILE: model, checkpoint.TRAINER_FILE: state,
                  checkpoint.TRAINER_JSON: json.dumps({
                      "step": 1, "model_sha256": checkpoint.sha256_hex(model),
                      "trainer_sha256": checkpoint.sha256_hex(state)}, indent=2).encode()})
    return files


def save(run_dir: Path, weights, trainer, make) -> tuple[float, float]:
    """(seconds of the whole save, seconds of making its files' contents)."""
    start = time.perf_counter()
    files = make(weights, trainer)
    made = time.perf_counter() - start
    checkpoint.commit_files(run_dir, files)
    return time.perf_counter() - start, made


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", help="where to write (default: a temporary folder)")
    args = ap.parse_args()
    print(machine.summary(), flush=True)
    weights, trainer = smollm2_arrays()
    size = sum(a.nbytes for a in (*weights.values(), *trainer.values()))
    root = Path(tempfile.mkdtemp(dir=args.dir, prefix="sheepop-save-"))
    ways = {"sheepop (parts, writev)": sheepop_files,
            "reference (safetensors.numpy.save)": reference_files}
    times: dict[str, list[tuple[float, float]]] = {w: [] for w in ways}
    try:
        for r in range(args.rounds):
            for way, make in (ways.items() if r % 2 == 0 else list(ways.items())[::-1]):
                run_dir = root / "run"
                shutil.rmtree(run_dir, ignore_errors=True)
                times[way].append(save(run_dir, weights, trainer, make))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"SmolLM2-135M's shapes: {len(weights)} weight tensors, {size / 1e9:.2f} GB written per "
          f"save (weights and AdamW state) into {args.dir or tempfile.gettempdir()}; medians of "
          f"{args.rounds}, load average {os.getloadavg()[0]:.2f}")
    for way, t in times.items():
        whole, made = (statistics.median(x) for x in zip(*t))
        print(f"  {way:<36} save {whole:5.1f} s (of which making the files' contents "
              f"{made:4.1f} s); rounds: {', '.join(f'{w:.1f}' for w, _ in t)}")


if __name__ == "__main__":
    main()
