"""What sampling does to a small model's first answer: SmolLM2-135M-Instruct asked "What is the
capital of France?" through its chat template, at four sampling rules (issue 41, section 2).

    python benchmarks/first_answer.py                        # imports SmolLM2 first
    python benchmarks/first_answer.py --run /tmp/smol --seeds 20 --new-tokens 24

For each rule it prints:
- the probability that the first token drawn begins the English answer ("The", "Paris", with or
  without a leading space), exactly, from the first position's distribution after the rule;
- Paris in N seeds: the answers (up to --new-tokens tokens, or the end of the turn) that name
  Paris, seeds 0 .. N-1;
and the greedy answer.

The rules: sheepop before issue 41 (T 0.8, no filter), sheepop's defaults now (T 0.8, top-k 40,
top-p 0.95, min-p 0.05; temperature first, as transformers), llama.cpp's defaults in llama.cpp's
order (the same values, temperature last: tests/helpers/llama_cpp_order.py), and the model
card's (T 0.2, top-p 0.9). The NumPy engine, float32 weights dequantized from the GGUF file.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "helpers"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import machine  # noqa: E402
from llama_cpp_order import llama_cpp_probabilities  # noqa: E402
from real_model import smollm2_gguf  # noqa: E402

from sheepop.generation.sample import draw, probabilities  # noqa: E402

QUESTION = "What is the capital of France?"
ENGLISH_STARTS = ("The", " The", "Paris", " Paris")
RULES = {  # name: (order, temperature, top_k, top_p, min_p)
    "sheepop before (T 0.8 only)": ("sheepop", 0.8, 0, 1.0, 0.0),
    "sheepop now (T 0.8, k 40, p 0.95, min-p 0.05)": ("sheepop", 0.8, 40, 0.95, 0.05),
    "llama.cpp (same values, T last)": ("llama.cpp", 0.8, 40, 0.95, 0.05),
    "model card (T 0.2, top-p 0.9)": ("sheepop", 0.2, 0, 0.9, 0.0),
}


def rule_probabilities(z: np.ndarray, rule: tuple) -> np.ndarray:
    order, *settings = rule
    if order == "llama.cpp":
        return llama_cpp_probabilities(z, *settings)
    return probabilities(z, *settings)


def first_token_ids(tokenizer) -> list[int]:
    """The ids whose token text is one of ENGLISH_STARTS (as one token each)."""
    ids = []
    for text in ENGLISH_STARTS:
        encoded = tokenizer.encode(text)
        if len(encoded) == 1:
            ids.append(encoded[0])
    return sorted(set(ids))


def answers(model, prompt: list[int], rule: tuple | None, seeds: range, new_tokens: int,
            end_ids: set[int], never: list[int]) -> list[str]:
    """The answer drawn under `rule` (None: greedy) for each seed s, with
    numpy.random.default_rng(s): all seeds in one batch, a row going on after its end unread."""
    rngs = [np.random.default_rng(s) for s in seeds]
    lm, out = model.lm, [[] for _ in seeds]
    ended = [False] * len(rngs)
    z = lm.prefill_batch([prompt] * len(rngs))
    for _ in range(new_tokens):
        z = np.asarray(z, dtype=np.float64).copy()
        z[:, never] = -np.inf
        tokens = [int(np.argmax(row)) if rule is None else
                  draw(rule_probabilities(row, rule), rng) for row, rng in zip(z, rngs)]
        for b, token in enumerate(tokens):
            ended[b] = ended[b] or token in end_ids
            if not ended[b]:
                out[b].append(token)
        if all(ended):
            break
        z = lm.decode_batch(tokens)
    return [model.tokenizer.decode(ids) for ids in out]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", type=Path, help="an imported SmolLM2 run (default: import it)")
    ap.add_argument("--seeds", type=int, default=20, help="seeds 0 .. SEEDS-1, drawn as a batch")
    ap.add_argument("--new-tokens", type=int, default=24)
    args = ap.parse_args()
    print(machine.summary())
    from sheepop.inference.load import load, never_generated
    from sheepop.tokenizers.chat_format import chat_ids, turn_end
    run = args.run
    if run is None:
        gguf, why = smollm2_gguf()
        if gguf is None:
            sys.exit(f"SmolLM2 is not available: {why}")
        from sheepop.interop.gguf import import_gguf
        run = Path(tempfile.mkdtemp(prefix="sheepop-bench-")) / "smollm2"
        import_gguf(gguf, run)
    model = load(run, engine="numpy")
    tok = model.tokenizer
    prompt = chat_ids(tok, [{"role": "user", "content": QUESTION}], True)[0]
    end = turn_end(tok)
    end_ids, never = set(end.ids) | set(tok.special_tokens.values()), never_generated(tok)
    z = np.asarray(model.lm.prefill(prompt), dtype=np.float64)
    z[never] = -np.inf
    english = first_token_ids(tok)
    p = probabilities(z, 1.0)
    top = np.argsort(-p)[:5]
    print("first token, the model's p: " + ", ".join(f"{tok.decode([int(i)])!r} {p[i]:.3f}"
                                                      for i in top))
    print(f"greedy: {answers(model, prompt, None, range(1), args.new_tokens, end_ids, never)[0]!r}")
    print(f"{'rule':48} {'P(English first token)':>22} {'Paris in ' + str(args.seeds):>12}")
    for name, rule in RULES.items():
        q = rule_probabilities(z, rule)
        paris = sum("Paris" in text for text in answers(model, prompt, rule, range(args.seeds),
                                                          args.new_tokens, end_ids, never))
        print(f"{name:48} {q[english].sum():>22.3f} {paris:>12}", flush=True)


if __name__ == "__main__":
    main()
