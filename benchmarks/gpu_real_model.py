"""Real-model shapes on one GPU: decode tokens/s at batch 1 and 16, and a training step's MFU.

    python benchmarks/gpu_real_model.py                  # one H100/H200, under 4 minutes
    python benchmarks/gpu_real_model.py --cpu-smoke      # tiny shapes on the CPU: does it run
    python benchmarks/gpu_real_model.py --decode-only --compile-decode   # decode compiled

No downloads: random weights (sheepop's initialisation rule) in the shapes of SmolLM2-135M
(30 layers, width 576, 9/3 heads, SwiGLU 1536, RMSNorm, rotary, vocabulary 49,152, tied) and
GPT-2 small (12 layers, width 768, 12 heads, GELU 3072, LayerNorm, learned positions,
vocabulary 50,257, tied). Speed does not depend on the weights' values.

- Decode: sheepop's inference model (sheepop.inference.load.build, torch engine, float32 and
  bfloat16), greedy, `--new` tokens after a `--prompt`-token prompt, at batch 1 and batch 16
  (one KV cache row each; `decode_batch`), tokens/s = batch x steps / seconds of the decode
  steps (each step hands its logits back to the host, so every step is synchronised). Each
  model first decodes `--warmup-tokens` untimed steps at each batch (kernel choice, the
  allocator's growth); then the dtypes take turns, `--repeats` times; the median is printed.
  (bf16 decoding was ~10x slower over cache lengths it had not seen, warm-up or not: cuDNN's
  attention plans each new shape, which generation now leaves out, sheepop.model.lm.
  generation_attention; docs/performance.md, "On a GPU".) `--compile-decode` decodes through
  torch.compile, as `generate --compile` does (the warm-up pays the compilation).
- Training: sheepop's training step (sheepop.train.engine_torch.TorchEngine: forward, loss,
  backward, clipping, fused AdamW) with bf16 autocast and torch.compile, `--batch` sequences
  of `--block` tokens; after `--warmup` steps (compilation), the median of `--steps` steps.
  MFU = 6 x parameters x tokens/s / peak, with the parameters counted once (tied head), the
  attention's own products left out (as the 6N rule does), and the peak the GPU's dense bf16
  figure from its name (printed; `--peak-tflops` to give another).
"""

from __future__ import annotations

import argparse
import statistics
import time

import machine
import numpy as np
import torch

from sheepop.config.build import build_config
from sheepop.config.schema import Config, ModelConfig
from sheepop.inference.load import build
from sheepop.model import GPT
from sheepop.train.engine_torch import TorchEngine

SHAPES = {
    "smollm2-135m": dict(vocab_size=49152, block_size=2048, n_layer=30, n_head=9, n_kv_head=3,
                         n_embd=576, d_ff=1536, pos_encoding="rope", rope_theta=1e5,
                         norm="rmsnorm", ffn="swiglu", activation="silu", bias=False,
                         tie_weights=True, ln_eps=1e-5, dropout=0.0),
    "gpt2-small": dict(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768,
                       pos_encoding="learned", activation="gelu_tanh", bias=True,
                       tie_weights=True, dropout=0.0),
}
SMOKE = dict(vocab_size=256, block_size=128, n_layer=2, n_head=4, n_embd=64, dropout=0.0)
# Dense bf16 tensor-core peaks (NVIDIA's data sheets, without sparsity), by a piece of the name.
PEAK_TFLOPS = (("H200", 989.0), ("H100 PCIe", 756.0), ("H100", 989.0), ("A100", 312.0),
               ("L40S", 362.0), ("L4", 121.0))


def peak_flops(device: torch.device, given: float | None) -> tuple[float, str]:
    if given is not None:
        return given * 1e12, f"{given:g} TFLOP/s (given)"
    if device.type != "cuda":
        return 1e12, "1 TFLOP/s (a placeholder for the CPU smoke run: MFU means nothing there)"
    name = torch.cuda.get_device_name(device)
    for piece, tflops in PEAK_TFLOPS:
        if piece in name:
            return tflops * 1e12, f"{tflops:g} TFLOP/s dense bf16 ({name})"
    raise SystemExit(f"unknown GPU {name!r}: give its dense bf16 peak with --peak-tflops")


def decode_rate(lm, batch: int, prompt: int, new: int, seed: int = 0) -> float:
    """Tokens/s of `new` greedy decode steps of `batch` sequences after their prompts."""
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, lm.model.cfg.vocab_size, size=(batch, prompt)).tolist()
    if batch == 1:
        token = int(np.argmax(lm.prefill(rows[0])))
        t0 = time.perf_counter()
        for _ in range(new):
            token = int(np.argmax(lm.decode(token)))
    else:
        tokens = np.argmax(lm.prefill_batch(rows), axis=-1).tolist()
        t0 = time.perf_counter()
        for _ in range(new):
            tokens = np.argmax(lm.decode_batch(tokens), axis=-1).tolist()
    return batch * new / (time.perf_counter() - t0)


def decode_table(name: str, model_cfg: dict, device: str, args) -> None:
    config = Config()
    config.model = ModelConfig(**model_cfg)
    torch.manual_seed(0)
    weights = GPT(config.model).numpy_weights()
    models = {d: build(config, weights, None, "torch", device, d, compile=args.compile_decode)
              for d in ("float32", "bfloat16")}
    del weights
    label = " compiled" if args.compile_decode else ""
    for batch in (1, 16):
        for m in models.values():  # untimed: kernel selection, the allocator's growth, compiling
            decode_rate(m.lm, batch, args.prompt, args.warmup_tokens)
        rates: dict[str, list[float]] = {d: [] for d in models}
        for _ in range(args.repeats):
            for d, m in models.items():
                rates[d].append(decode_rate(m.lm, batch, args.prompt, args.new))
        shown = ", ".join(f"{d} {statistics.median(r):,.0f}" for d, r in rates.items())
        print(f"  decode{label} {name:<13} batch {batch:>2}: tokens/s {shown} "
              f"(runs: {', '.join(' '.join(f'{x:.0f}' for x in r) for r in rates.values())})",
              flush=True)
    del models


def train_mfu(name: str, model_cfg: dict, device: str, args, peak: float) -> None:
    cfg = build_config(None, None, [
        *(f"model.{k}={v}" for k, v in model_cfg.items()),
        f"model.block_size={args.block}", f"train.batch_size={args.batch}",
        f"train.device={device}", "train.dtype=bfloat16",
        f"train.compile={'false' if args.no_compile else 'true'}"])
    cfg.model.block_size = args.block
    engine = TorchEngine(cfg.model, cfg.train)
    rng = np.random.default_rng(0)
    data = rng.integers(0, cfg.model.vocab_size, size=(4, args.batch, args.block + 1))
    t0 = time.perf_counter()
    for i in range(args.warmup):
        engine.train_step([(data[i % 4, :, :-1], data[i % 4, :, 1:])], 1e-4)
    warm = time.perf_counter() - t0
    times = []
    for i in range(args.steps):
        t0 = time.perf_counter()
        loss, _ = engine.train_step([(data[i % 4, :, :-1], data[i % 4, :, 1:])], 1e-4)
        times.append(time.perf_counter() - t0)
    step = statistics.median(times)
    params = engine.num_params()
    rate = args.batch * args.block / step
    print(f"  train  {name:<13} bf16 autocast{'' if args.no_compile else ' + compile'}: "
          f"{params / 1e6:.1f}M parameters, {args.batch} x {args.block} tokens, step "
          f"{step * 1e3:.1f} ms (median of {args.steps}; warm-up {warm:.0f} s), "
          f"{rate:,.0f} tokens/s, MFU {6 * params * rate / peak:.3f}; loss {loss:.3f}",
          flush=True)
    del engine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="tiny shapes on the CPU, a few steps: checks that the script runs")
    ap.add_argument("--shapes", nargs="+", choices=SHAPES, default=list(SHAPES))
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--block", type=int, default=1024)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup-tokens", type=int, default=64,
                    help="untimed decode steps per model and batch before the timed runs")
    ap.add_argument("--compile-decode", action="store_true",
                    help="decode through torch.compile (generate --compile)")
    ap.add_argument("--decode-only", action="store_true", help="skip the training step")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--peak-tflops", type=float)
    args = ap.parse_args()
    if args.cpu_smoke:
        device = "cpu"
        args.prompt, args.new, args.repeats, args.warmup_tokens = 8, 8, 1, 4
        args.batch, args.block, args.warmup, args.steps = 2, 32, 1, 2
        shapes = {"smoke": SMOKE}
    else:
        if not torch.cuda.is_available():
            raise SystemExit("no CUDA device: run with --cpu-smoke to check the script here")
        device = "cuda"
        torch.backends.cuda.matmul.allow_tf32 = True  # float32 decode as a user would run it
        shapes = {n: SHAPES[n] for n in args.shapes}
    if args.compile_decode:  # dynamo counts recompilations per function, across models: two
        # dtypes x two batch sizes x (prefill, decode) are already 8 graphs of GPT.forward
        torch._dynamo.config.recompile_limit = 64
    peak, peak_text = peak_flops(torch.device(device), args.peak_tflops)
    start = time.perf_counter()
    where = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    print(f"{where}; peak assumed: {peak_text}; host: {machine.summary()}", flush=True)
    for name, model_cfg in shapes.items():
        decode_table(name, model_cfg, device, args)
        print(f"  ({time.perf_counter() - start:.0f} s so far)", flush=True)
    for name, model_cfg in ({} if args.decode_only else shapes).items():
        train_mfu(name, model_cfg, device, args, peak)
        print(f"  ({time.perf_counter() - start:.0f} s so far)", flush=True)
        if device == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
