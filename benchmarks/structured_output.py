"""Structured output on SmolLM2-135M-Instruct: samples of a nested JSON schema at temperature 1,
every one validated with `jsonschema`, and what the token mask costs per token.

    python benchmarks/structured_output.py                       # 200 samples; imports SmolLM2
    python benchmarks/structured_output.py --run /tmp/smol --samples 20

The schema (constraint_libraries.NESTED): an object with a bounded string, a bounded integer, an
enum, an array of 1-4 numbers in [0, 1], a nested object with a pattern, an array of objects,
five required fields, no other field. The prompt asks for it in words through the chat template;
the answers are drawn in batches of --batch rows (seeds 0 .. samples-1, one row each, each with
its own constraint state) until the turn ends or --new-tokens.

Printed: how many samples ended (the turn's end token) and how many of those validate (the
target: all of them), then the cost per generated token, alternating batch by batch between
the same batch of rows constrained and unconstrained (each unconstrained row runs exactly as many
tokens as its constrained twin took, then leaves the batch as that one did): seconds per
row-token each way, and the mask's own part (computing it and advancing the states; applying it
is in the difference), timed inside the constrained runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "helpers"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import jsonschema  # noqa: E402
import machine  # noqa: E402
from constraint_libraries import NESTED  # noqa: E402
from real_model import smollm2_gguf  # noqa: E402

from sheepop.config.schema import SampleConfig  # noqa: E402
from sheepop.generation import constraint as constraint_module  # noqa: E402
from sheepop.generation.generate import generate_batch, generate_batch_ids  # noqa: E402

ASK = ("Write a JSON object describing a person: name, age, role (admin, user or guest), "
       "scores (numbers from 0 to 1), address (city, zip) and tags.")


class MaskClock:
    """Time spent in the constraint states' `allowed` and `advance` (wrapped for the run)."""

    def __init__(self):
        self.seconds = 0.0
        state = constraint_module.ConstraintState
        for name in ("allowed", "advance"):
            setattr(state, name, self._timed(getattr(state, name)))

    def _timed(self, fn):
        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t
        return timed


def unconstrained(lm, prompt: list[int], cfg: SampleConfig, seeds: list[int],
                  lengths: list[int]) -> int:
    """The same rows without a mask, row b leaving after lengths[b] tokens (as its constrained
    twin did): the tokens generated."""
    steps = generate_batch(lm, [prompt] * len(seeds), cfg, eos_id=None, seeds=seeds)
    n, count, step = 0, 0, next(steps)
    while True:
        count += 1
        n += sum(token is not None for token in step)
        ended = {b for b, token in enumerate(step) if token is not None and count >= lengths[b]}
        try:
            step = steps.send(ended)
        except StopIteration:
            return n


def smollm2_run(run: Path | None) -> Path:
    if run is not None:
        return run
    gguf, why = smollm2_gguf()
    if gguf is None:
        sys.exit(f"SmolLM2 is not available: {why}")
    from sheepop.interop.gguf import import_gguf
    run = Path(tempfile.mkdtemp(prefix="sheepop-bench-")) / "smollm2"
    import_gguf(gguf, run)
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", type=Path, help="an imported SmolLM2 run (default: import it)")
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--batch", type=int, default=10, help="rows generated together")
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--engine", default="numpy", choices=["numpy", "torch"])
    ap.add_argument("--threads", type=int, default=0, help="0: the idle cores (sheepop.threads)")
    args = ap.parse_args()
    from sheepop import threads
    print(f"threads: {threads.apply(args.threads)}")
    print(machine.summary())
    from sheepop.inference.load import load
    from sheepop.tokenizers.chat_format import chat_ids, turn_end
    model = load(smollm2_run(args.run), engine=args.engine)
    tok = model.tokenizer
    prompt = chat_ids(tok, [{"role": "user", "content": ASK}], True)[0]
    (end,) = turn_end(tok).ids
    t = time.perf_counter()
    compiled = constraint_module.compile_constraint(
        constraint_module.ConstraintSpec("json_schema", NESTED), tok)
    print(f"vocabulary and schema compiled in {time.perf_counter() - t:.2f} s "
          f"(llguidance, {tok.vocab_size:,} ids)")
    clock = MaskClock()
    ended = valid = 0
    costs: dict[str, list[float]] = {"with the mask": [], "without": []}
    mask_seconds, constrained_tokens = 0.0, 0
    failures = []
    for first in range(0, args.samples, args.batch):
        seeds = list(range(first, min(first + args.batch, args.samples)))
        cfg = SampleConfig(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
                           max_new_tokens=args.new_tokens)
        before = clock.seconds
        t = time.perf_counter()
        outputs = generate_batch_ids(model.lm, [prompt] * len(seeds), cfg, eos_id=end,
                                     seeds=seeds,
                                     constraints=[compiled.start({end}) for _ in seeds])
        elapsed = time.perf_counter() - t
        n = sum(len(o) for o in outputs)
        costs["with the mask"].append(elapsed / n)
        mask_seconds += clock.seconds - before
        constrained_tokens += n
        t = time.perf_counter()
        n_free = unconstrained(model.lm, prompt, cfg, seeds, [len(o) for o in outputs])
        costs["without"].append((time.perf_counter() - t) / n_free)
        for seed, o in zip(seeds, outputs):
            if o[-1] != end:
                failures.append((seed, "cut at --new-tokens", tok.decode(o)))
                continue
            ended += 1
            text = tok.decode(o[:-1])
            try:
                jsonschema.validate(json.loads(text), NESTED)
                valid += 1
            except (ValueError, jsonschema.ValidationError) as e:
                failures.append((seed, str(e).splitlines()[0], text))
        print(f"  {seeds[-1] + 1} samples: {ended} ended, {valid} valid", flush=True)
    print(f"\n{args.samples} samples at temperature 1: {ended} ended on the turn's end, "
          f"{valid} of them valid against the schema (jsonschema)")
    for seed, why, text in failures[:5]:
        print(f"  seed {seed}: {why}: {text[:160]!r}")
    w, wo = (statistics.median(costs[k]) * 1e3 for k in ("with the mask", "without"))
    print(f"cost per row-token (median of {len(costs['without'])} batches of {args.batch}, "
          f"{args.engine} engine): with the mask {w:.2f} ms, without {wo:.2f} ms "
          f"({w / wo:.2f}x); the mask's own part {1e3 * mask_seconds / constrained_tokens:.3f} "
          f"ms a token (computing it, advancing the states)")


if __name__ == "__main__":
    main()
