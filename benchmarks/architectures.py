"""GPT (`tiny`) against Llama (`tiny-llama`) and one ablation per component, for the same wall time.

    python benchmarks/architectures.py                       # 6 contenders x 10 min (~70 min)
    python benchmarks/architectures.py --minutes 0.2 --contenders gpt,llama --rounds 2

Contenders (each ablation is `tiny` with one component changed):
    gpt            the `tiny` preset: sinusoidal positions, LayerNorm, GELU MLP (d_ff 512),
                   4 heads with 4 key/value heads, biases, tied head
    gpt+rope       model.pos_encoding=rope
    gpt+rmsnorm    model.norm=rmsnorm
    gpt+swiglu     model.ffn=swiglu with d_ff 384 as in tiny-llama (3 matrices of 128 x 384
                   against the MLP's 2 of 128 x 512: +12.5% FFN parameters; the default 320
                   would be -6%)
    gpt+gqa        model.n_kv_head=2 (of 4 heads)
    llama          the `tiny-llama` preset (all of the above, no biases, untied head)

All train on the data `make run` uses (the standard-library source, char tokenizer, the last 10%
of the tokens held out), the same batches in the same order (train.seed), on the torch engine,
float32, train.threads=1 (--threads). Fairness on a shared machine whose load drifts:

1. probe: every contender's step time, measured in this process on alternating blocks of steps;
2. each contender gets steps = budget / its step time, and its cosine schedule spans those steps
   (train.decay_steps);
3. the contenders train round-robin in --rounds chunks (`sheepop train --resume --steps`: exact
   resumption), the order rotating each round, so all of them see the same periods of load.

Reported per contender: parameters, KV cache bytes per token (float32), steps, the training
seconds actually used (the sum of the chunks' step times: the trainer's tokens/s at each chunk's
end; start-up, evaluation and saving excluded), tokens/s, the final validation loss (nats/token)
and bits per byte (the trainer's `val_bpb`: nats / ln 2 over the UTF-8 bytes of the evaluated
targets' text), evaluated on --eval-batches fixed batches of the val split.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import machine
import torch

from sheepop.config.build import build_config
from sheepop.config.model_size import kv_cache_bytes_per_token, param_count
from sheepop.config.schema import resolve_vocab_size
from sheepop.data.dataset import load_dataset
from sheepop.data.shards import TokenWriter, token_dtype_name, write_meta
from sheepop.data.windows import WindowSampler
from sheepop.train.start import make_engine

# name, preset, overrides on it, what differs from `tiny`
CONTENDERS = [
    ("gpt", "tiny", [], "the `tiny` preset"),
    ("gpt+rope", "tiny", ["model.pos_encoding=rope"], "rotary positions"),
    ("gpt+rmsnorm", "tiny", ["model.norm=rmsnorm"], "RMSNorm"),
    ("gpt+swiglu", "tiny", ["model.ffn=swiglu", "model.activation=silu", "model.d_ff=384"],
     "SwiGLU, d_ff 384"),
    ("gpt+gqa", "tiny", ["model.n_kv_head=2"], "2 key/value heads of 4"),
    ("llama", "tiny-llama", [], "the `tiny-llama` preset"),
]


def prepare_builtin(data_dir: Path, cfg) -> None:
    """The built-in corpus as `sheepop train` without DATA builds it (same tokenizer, same
    tokens, same split), written once as a prepared directory so each chunk memory-maps it
    instead of re-reading and re-encoding 8 MB."""
    data = load_dataset(None, cfg.data)
    data_dir.mkdir(parents=True)
    dtype = token_dtype_name(data.tokenizer.vocab_size)
    for name, tokens in (("train.bin", data.train), ("val.bin", data.val)):
        writer = TokenWriter(data_dir / name, dtype)
        writer.write(tokens)
        writer.close()
    data.tokenizer.save(data_dir / "tokenizer.json")
    header = {"dtype": dtype, "vocab_size": data.tokenizer.vocab_size,
              "tokenizer_kind": data.tokenizer.kind, "eos_id": data.tokenizer.eos_id,
              "train_tokens": len(data.train), "val_tokens": len(data.val),
              "inputs": ["builtin stdlib corpus"]}
    write_meta(data_dir / "meta.json", header, [], {"report": data.report})


def contender_config(preset: str, overrides: list[str], common: list[str], vocab: int):
    cfg = build_config(preset, None, overrides + common)
    resolve_vocab_size(cfg.model, vocab, "the tokenizer")
    cfg.validate()
    return cfg


def probe(configs: dict, data, rounds: int, block: int) -> dict[str, float]:
    """Median seconds per training step of each contender: after 2 unmeasured steps each,
    `rounds` rounds of `block` steps per contender, the order rotating, so load drift during
    the probe falls on all of them."""
    engines, samplers, times = {}, {}, {}
    for name, cfg in configs.items():
        t, m = cfg.train, cfg.model
        engines[name] = make_engine(cfg)
        samplers[name] = WindowSampler(data.train, m.block_size, t.batch_size, t.seed,
                                       cfg.data.sampling, cfg.data.stride, 0)
        times[name] = []
        for _ in range(2):
            engines[name].train_step([samplers[name].next_batch()], t.lr)
    names = list(configs)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            for _ in range(block):
                batch = [samplers[name].next_batch()]
                t0 = time.perf_counter()
                engines[name].train_step(batch, configs[name].train.lr)
                times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def chunk_ends(steps: int, rounds: int) -> list[int]:
    """The step each of `rounds` chunks ends at: floor(steps (r + 1) / rounds), so the last is
    `steps` and, with steps >= rounds, every chunk has at least one step."""
    return [steps * (r + 1) // rounds for r in range(rounds)]


def sheepop_train(args: list[str], threads: int) -> float:
    """Run `sheepop train ARGS`; its wall seconds. Stops the benchmark when it fails."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "OPENBLAS_NUM_THREADS": str(threads)}
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "sheepop", "train", *args, "--no-progress"],
                          capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.exit(f"sheepop train {' '.join(args)} failed ({done.returncode}):\n"
                 f"{done.stdout}{done.stderr}")
    return time.perf_counter() - t0


def train_round_robin(plan: dict, data_dir: Path, work: Path, common: list[str],
                      threads: int, rounds: int) -> dict[str, float]:
    """Each contender's chunks, round by round (order rotating); process wall seconds each."""
    names, wall = list(plan), dict.fromkeys(plan, 0.0)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            p = plan[name]
            out, end = work / name, p["ends"][r]
            if r == 0:
                sets = [f"train.decay_steps={p['steps']}"] + p["overrides"] + common
                args = [str(data_dir), "--preset", p["preset"], "--out", str(out),
                        "--steps", str(end), *[a for s in sets for a in ("--set", s)]]
            else:
                args = ["--resume", "--out", str(out), "--steps", str(end)]
            wall[name] += sheepop_train(args, threads)
        print(f"round {r + 1}/{rounds} done, load {os.getloadavg()[0]:.2f}", flush=True)
    return wall


def result(name: str, p: dict, run_dir: Path, wall: float) -> dict:
    """The figures of one contender from its metrics.jsonl: the record at each chunk's end holds
    that chunk's tokens/s (its steps over its time, evaluation excluded) and a validation."""
    rows = {r["step"]: r for line in (run_dir / "metrics.jsonl").read_text().splitlines()
            if (r := json.loads(line))}
    seconds, starts, curve = 0.0, [0] + p["ends"][:-1], []
    for start, end in zip(starts, p["ends"]):
        seconds += (end - start) * p["tokens_per_step"] / rows[end]["tokens_per_sec"]
        curve.append({"step": end, "train_seconds": round(seconds, 1),
                      "val_loss": rows[end]["val_loss"], "val_bpb": rows[end].get("val_bpb")})
    last = rows[p["ends"][-1]]
    return {"name": name, "changes": p["changes"], "params": p["params"],
            "kv_bytes_per_token": p["kv_bytes"], "steps": p["steps"],
            "probe_ms_per_step": round(1000 * p["probe_s"], 1),
            "train_seconds": round(seconds, 1), "process_seconds": round(wall, 1),
            "tokens_per_sec": round(p["steps"] * p["tokens_per_step"] / seconds),
            "val_loss": last["val_loss"], "val_bpb": last.get("val_bpb"), "curve": curve}


def table(results: list[dict]) -> str:
    base = next((r for r in results if r["name"] == "gpt"), None)
    lines = ["| model | change from `tiny` | parameters | KV cache B/token | steps | train s "
             "| tokens/s | val loss | val bits/byte | vs gpt |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        bpb = "n/a" if r["val_bpb"] is None else f"{r['val_bpb']:.4f}"
        delta = ("" if base is None or base["val_bpb"] is None or r["val_bpb"] is None
                 or r is base else f"{r['val_bpb'] - base['val_bpb']:+.4f}")
        lines.append(f"| {r['name']} | {r['changes']} | {r['params']:,} | "
                     f"{r['kv_bytes_per_token']:,} | {r['steps']:,} | {r['train_seconds']:.0f} | "
                     f"{r['tokens_per_sec']:,} | {r['val_loss']:.4f} | {bpb} | {delta} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=10.0, help="training time per contender")
    p.add_argument("--contenders", default=",".join(c[0] for c in CONTENDERS),
                   help="comma-separated names (default: all six)")
    p.add_argument("--rounds", type=int, default=10, help="round-robin chunks per contender")
    p.add_argument("--threads", type=int, default=1, help="train.threads of every run")
    p.add_argument("--eval-batches", type=int, default=20,
                   help="validation batches (of 16 x 128 tokens) at each chunk's end")
    p.add_argument("--probe-rounds", type=int, default=6)
    p.add_argument("--probe-steps", type=int, default=5, help="steps per probe block")
    p.add_argument("--set", dest="overrides", action="append", default=[],
                   help="a config override for every contender (repeatable)")
    p.add_argument("--work", help="keep data and runs here (default: a temporary directory)")
    p.add_argument("--out", help="also write the header and table (markdown) to this file")
    args = p.parse_args(argv)
    chosen = args.contenders.split(",")
    unknown = set(chosen) - {c[0] for c in CONTENDERS}
    if unknown:
        p.error(f"unknown contenders {sorted(unknown)}; known: {[c[0] for c in CONTENDERS]}")
    info = machine.describe(load_start=os.getloadavg())
    common = ["train.engine=torch", "train.dtype=float32", "train.device=cpu",
              f"train.threads={args.threads}", "train.eval_interval=0",
              "train.checkpoint_interval=0", f"train.eval_batches={args.eval_batches}",
              *args.overrides]
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work or tmp)
        data_dir = work / "data"
        if not (data_dir / "meta.json").exists():
            prepare_builtin(data_dir, build_config("tiny", None, []))
        data = load_dataset(data_dir, build_config("tiny", None, []).data)
        vocab, n_train, n_val = data.tokenizer.vocab_size, len(data.train), len(data.val)
        specs = [c for c in CONTENDERS if c[0] in chosen]
        configs = {n: contender_config(pre, ov, common, vocab) for n, pre, ov, _ in specs}
        step_s = probe(configs, data, args.probe_rounds, args.probe_steps)
        plan = {}
        for name, preset, overrides, changes in specs:
            cfg = configs[name]
            steps = max(args.rounds, int(60 * args.minutes / step_s[name]))
            plan[name] = {"preset": preset, "overrides": overrides, "changes": changes,
                          "steps": steps, "ends": chunk_ends(steps, args.rounds),
                          "probe_s": step_s[name], "params": param_count(cfg.model),
                          "kv_bytes": kv_cache_bytes_per_token(cfg.model),
                          "tokens_per_step": cfg.train.batch_size * cfg.train.grad_accum
                          * cfg.model.block_size}
            print(f"{name:<12} probe {1000 * step_s[name]:6.1f} ms/step -> {steps:,} steps",
                  flush=True)
        wall = train_round_robin(plan, data_dir, work, common, args.threads, args.rounds)
        results = [result(n, plan[n], work / n, wall[n]) for n in plan]
    info["load_end"] = os.getloadavg()
    header = (f"{machine.summary(info)} (at the start); torch engine, float32, {args.threads} "
              f"thread(s) per run; {args.minutes:g} min per contender in {args.rounds} rounds; "
              f"load average at the end {' '.join(f'{x:.2f}' for x in info['load_end'])}; "
              f"data: the built-in corpus "
              f"({n_train:,} train / {n_val:,} val tokens, char tokenizer, "
              f"vocabulary {vocab})")
    text = f"{header}\n\n{table(results)}\n"
    print("\n" + text)
    print(json.dumps({**info, "minutes": args.minutes, "rounds": args.rounds,
                      "threads": args.threads, "results": results}))
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
