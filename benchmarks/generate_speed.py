"""Generation speed: tokens/s with and without the KV cache, and against Hugging Face.

    python benchmarks/generate_speed.py                          # baby and gpt2-small, B=1 and 8
    python benchmarks/generate_speed.py --presets baby --threads 1 --compile

For each preset (random weights, dropout 0; baby with a 65-symbol vocabulary, gpt2-small with
GPT-2's 50257) it times greedy generation of `--new-tokens` tokens after a one-token prompt
(baby's context is 256: one prompt token + 256 new ones fill it exactly, so no window slides):

- sheepop with its preallocated KV cache, and without a cache (the whole context recomputed at
  every step); batch 1 and batch B (several prompts at once);
- Hugging Face `transformers` `GPT2LMHeadModel.generate` (its own KV cache) on the same weights:
  gpt2-small is GPT-2-shaped as it is; for baby, a GPT-2-shaped twin of the same size (learned
  positions, gelu_tanh) is timed on both sides.

Both libraries run in this one process with the same torch threads, alternating `--repeats`
times, and each keeps its best run, so their ratio is fair even on a machine shared with other
work (the absolute figures are not). The run without a cache is timed once.
Recomputation without a cache grows with the square of the length: for gpt2-small it is timed
on `--gpt2-no-cache-tokens` new tokens (batch 1 only unless `--full`), which flatters it.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import machine
import torch

from sheepop.config.build import build_config
from sheepop.config.schema import ModelConfig, SampleConfig
from sheepop.generation.generate import generate, generate_batch_ids
from sheepop.model import GPT, TorchLM

VOCAB = {"baby": 65, "gpt2-small": 50257}


def model_config(preset: str, gpt2_shaped: bool) -> ModelConfig:
    cfg = build_config(preset).model
    cfg = dataclasses.replace(cfg, vocab_size=VOCAB.get(preset, 256), dropout=0.0)
    if gpt2_shaped:
        cfg = dataclasses.replace(cfg, pos_encoding="learned", activation="gelu_tanh",
                                  bias=True, tie_weights=True, head_bias=False)
    return cfg


def prompts(batch: int, vocab: int) -> list[list[int]]:
    return [[(17 * b + 3) % vocab] for b in range(batch)]


def timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def sheepop_run(lm: TorchLM, batch: int, new: int, cache: bool) -> tuple[float, list]:
    sc = SampleConfig(max_new_tokens=new, temperature=0)
    rows = prompts(batch, lm.model.cfg.vocab_size)
    if batch == 1:
        return timed(lambda: [[s.token for s in generate(lm, rows[0], sc, use_cache=cache)]])
    return timed(lambda: generate_batch_ids(lm, rows, sc, use_cache=cache))


def hf_model(model: GPT):
    import transformers

    from sheepop.interop.gpt2 import hf_config, to_hf_weights
    config = transformers.GPT2Config(**{k: v for k, v in hf_config(model.cfg).items()
                                        if k not in ("architectures", "dtype")})
    hf = transformers.GPT2LMHeadModel(config).eval()
    state = {k: torch.from_numpy(v) for k, v in to_hf_weights(model.numpy_weights(),
                                                              model.cfg).items()}
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert set(missing) <= {"lm_head.weight"} and not unexpected, (missing, unexpected)
    hf.tie_weights()
    assert torch.equal(hf.lm_head.weight, hf.transformer.wte.weight)
    return hf


def hf_run(hf, batch: int, new: int, vocab: int) -> tuple[float, list]:
    ids = torch.tensor(prompts(batch, vocab))

    def run():
        with torch.inference_mode():
            out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                              min_new_tokens=new, do_sample=False, pad_token_id=0,
                              eos_token_id=None, use_cache=True)
        return out[:, ids.shape[1]:].tolist()
    return timed(run)


def agree(a: list[list[int]], b: list[list[int]]) -> str:
    """How many leading greedy tokens two runs share (float rounding may split near-ties)."""
    same = [next((i for i, (x, y) in enumerate(zip(r, s)) if x != y), min(len(r), len(s)))
            for r, s in zip(a, b)]
    return "all" if all(n == len(r) for n, r in zip(same, a)) else f"first {min(same)}"


def bench(preset: str, batches: list[int], new: int, args: argparse.Namespace) -> list[dict]:
    rows = []
    torch.manual_seed(0)
    model = GPT(model_config(preset, gpt2_shaped=False))
    lm = TorchLM(model)
    gpt2_shaped = model if preset == "gpt2-small" else GPT(model_config(preset, True))
    twin = lm if gpt2_shaped is model else TorchLM(gpt2_shaped)
    hf = None if args.skip_hf else hf_model(gpt2_shaped)
    if args.dtype != "float32":  # both libraries in the same dtype
        dtype = getattr(torch, args.dtype)
        for one in {id(lm): lm, id(twin): twin}.values():
            one.cast(dtype)
        if hf is not None:
            hf.to(dtype)
    V = gpt2_shaped.cfg.vocab_size
    compiled = None
    if args.compile:
        compiled = TorchLM(model, compile=True)
        t, _ = sheepop_run(compiled, 1, new, True)  # compiles (and specialises) the shapes
        print(f"  {preset}: torch.compile warm-up {t:.1f} s", flush=True)
    for B in batches:
        r = {"preset": preset, "batch": B, "new": new}
        # The fast runs alternate, `--repeats` times each, and keep their best time: load
        # from other processes then hits both libraries alike instead of whichever ran last.
        runs = {"cache": lambda B=B: sheepop_run(lm, B, new, True)}
        if compiled is not None:
            runs["compiled"] = lambda B=B: sheepop_run(compiled, B, new, True)
        if hf is not None:
            runs["hf"] = lambda B=B: hf_run(hf, B, new, V)
            if twin is not lm:
                runs["twin"] = lambda B=B: sheepop_run(twin, B, new, True)
        sheepop_run(lm, B, 4, True)  # warm-up
        if compiled is not None:
            sheepop_run(compiled, B, 8, True)  # a batch shape compiles once more
        if hf is not None:
            hf_run(hf, B, 4, V)
        outputs = {}
        for _ in range(args.repeats):
            for name, fn in runs.items():
                t, outputs[name] = fn()
                r[name] = max(r.get(name, 0.0), B * new / t)
        if hf is not None:
            r.setdefault("twin", r["cache"])
            r["hf_same_tokens"] = agree(outputs.get("twin", outputs["cache"]), outputs["hf"])
        no_cache_new = new if preset != "gpt2-small" else args.gpt2_no_cache_tokens
        if not args.skip_no_cache and (preset != "gpt2-small" or B == 1 or args.full):
            t, plain = sheepop_run(lm, B, no_cache_new, False)
            r["no_cache"], r["no_cache_new"] = B * no_cache_new / t, no_cache_new
            r["same_tokens"] = agree([c[:no_cache_new] for c in outputs["cache"]], plain)
        rows.append(r)
        print(format_row(r), flush=True)
    return rows


HEADER = (f"{'preset':<11} {'B':>2} {'cache tok/s':>11} {'no-cache tok/s':>16} {'speedup':>8} "
          f"{'compiled':>9} {'sheepop*':>9} {'HF tok/s':>9} {'ours/HF':>8}  tokens agree")


def format_row(r: dict) -> str:
    nc = "-"
    if "no_cache" in r:
        nc = f"{r['no_cache']:.1f}"
        if r["no_cache_new"] != r["new"]:
            nc += f" ({r['no_cache_new']})"
    speed = f"{r['cache'] / r['no_cache']:.1f}x" if "no_cache" in r else "-"
    comp = f"{r['compiled']:.1f}" if "compiled" in r else "-"
    twin = f"{r['twin']:.1f}" if "twin" in r else "-"
    hf = f"{r['hf']:.1f}" if "hf" in r else "-"
    ratio = f"{r['twin'] / r['hf']:.2f}" if "hf" in r else "-"
    agree_txt = f"nocache {r.get('same_tokens', '-')}, HF {r.get('hf_same_tokens', '-')}"
    return (f"{r['preset']:<11} {r['batch']:>2} {r['cache']:>11.1f} {nc:>16} {speed:>8} "
            f"{comp:>9} {twin:>9} {hf:>9} {ratio:>8}  {agree_txt}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--presets", nargs="+", default=["baby", "gpt2-small"])
    p.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--gpt2-no-cache-tokens", type=int, default=64,
                   help="new tokens for gpt2-small without a cache (it is slow)")
    p.add_argument("--full", action="store_true",
                   help="also time gpt2-small without a cache at every batch size")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--compile", action="store_true", help="also time TorchLM(compile=True)")
    p.add_argument("--skip-hf", action="store_true", help="do not time transformers")
    p.add_argument("--skip-no-cache", action="store_true", help="do not time recomputation")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                   help="weights and cache of both libraries")
    p.add_argument("--repeats", type=int, default=3,
                   help="alternating runs of each cached generation; the best one counts")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"{machine.summary()}; {torch.get_num_threads()} torch threads, {args.dtype}, greedy, "
          f"one-token prompts, {args.new_tokens} new tokens")
    print("sheepop* = sheepop with the KV cache on the GPT-2-shaped weights HF runs "
          "(the same model as 'cache' for gpt2-small)")
    print(HEADER)
    for preset in args.presets:
        bench(preset, args.batches, args.new_tokens, args)


if __name__ == "__main__":
    main()
