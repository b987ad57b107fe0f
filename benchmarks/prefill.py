"""Prefill speed: a 512-token prompt's tokens/s, sheepop's two engines against `transformers`, in
one run, taking turns.

    nice python benchmarks/prefill.py                       # SmolLM2's shape, 1 and 2 threads
    nice python benchmarks/prefill.py --threads 1 --rounds 7 --tokens 256

The model is SmolLM2-135M's shape (benchmarks/decode_shapes.py) with random weights, the same
weights in all three: sheepop's own (both engines), and `transformers`' LlamaForCausalLM built
from the config sheepop exports (sheepop.interop.llama.hf_config) holding them in its layout
(to_hf_weights: q and k rows in rotate-half order). Prefill is one forward pass over the
prompt: matrix-matrix products, bound by arithmetic rather than by reading the weights, so
random weights time what trained ones do. Each contender computes the logits after the prompt
(the last position only where the library allows: sheepop's `prefill`, transformers'
`logits_to_keep=1`), float32, at each thread count (sheepop.threads.apply), `--rounds` turns;
medians, ratios to transformers, the load average and the largest logit difference (the three
compute the same function) are printed.
"""

from __future__ import annotations

import argparse
import os

import decode_shapes as shapes
import machine
import numpy as np
import torch

from sheepop import threads
from sheepop.interop.llama import hf_config, to_hf_weights
from sheepop.scratch.init import init_params


def transformers_model(cfg, weights):
    from transformers import LlamaConfig, LlamaForCausalLM
    model = LlamaForCausalLM(LlamaConfig(**hf_config(cfg.model))).eval()
    state = {k: torch.from_numpy(np.ascontiguousarray(v))
             for k, v in to_hf_weights(weights, cfg.model).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    return model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="smollm2", choices=["smollm2"])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    cfg = shapes.shape_config(args.shape)
    weights = init_params(cfg.model, 0)
    from sheepop.inference import load as inference
    sheepop_lms = {e: inference.build(cfg, weights, None, e, device="cpu").lm
                   for e in ("numpy", "torch")}
    hf = transformers_model(cfg, weights)
    ids = shapes.prompt_ids(cfg.model.vocab_size, args.tokens)
    ids_t = torch.tensor([ids])

    def hf_logits() -> np.ndarray:
        with torch.inference_mode():
            return hf(ids_t, logits_to_keep=1).logits[0, -1].float().numpy()

    logits = {"transformers": hf_logits(),
              **{f"sheepop {e}": lm.prefill(ids) for e, lm in sheepop_lms.items()}}
    gap = max(float(np.abs(v - logits["transformers"]).max()) for v in logits.values())
    print(f"{machine.summary()}; SmolLM2-135M shape, random weights, float32, a {len(ids)}-token "
          f"prompt; largest logit difference to transformers {gap:.1e}; medians of {args.rounds} "
          "turns")
    print("| threads | sheepop numpy tok/s | sheepop torch tok/s | transformers tok/s | numpy / "
          "transformers | torch / transformers | load |")
    print("|---|---|---|---|---|---|---|")
    contenders = {**{f"sheepop {e}": (lambda lm=lm: shapes.prefill_seconds(lm, ids))
                     for e, lm in sheepop_lms.items()}}

    def hf_seconds() -> float:
        import time
        t0 = time.perf_counter()
        hf_logits()
        return time.perf_counter() - t0

    contenders["transformers"] = hf_seconds
    for n in args.threads:
        threads.apply(n)
        for fn in contenders.values():  # warm-up
            fn()
        med = shapes.alternate(contenders, args.rounds)
        rate = {name: len(ids) / s for name, s in med.items()}
        hf_rate = rate["transformers"]
        print(f"| {n} | {rate['sheepop numpy']:.0f} | {rate['sheepop torch']:.0f} | "
              f"{hf_rate:.0f} | {rate['sheepop numpy'] / hf_rate:.2f} | "
              f"{rate['sheepop torch'] / hf_rate:.2f} | {os.getloadavg()[0]:.2f} |", flush=True)


if __name__ == "__main__":
    main()
