"""`sheepop generate RUN_DIR --prompt TEXT`: sample from a trained model, streamed as it goes."""

from __future__ import annotations

import argparse
import sys

from sheepop.config import SampleConfig
from sheepop.errors import UserError


def register(sub: argparse._SubParsersAction) -> None:
    d = SampleConfig()
    p = sub.add_parser(
        "generate", help="generate text from a trained model",
        description="Continue a prompt with a trained model. Output is streamed as it is "
                    "produced. --temperature 0 is greedy decoding.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory made by `sheepop train`")
    p.add_argument("--prompt", default="", help="text to continue ('-' reads stdin; empty: "
                   "start from the tokenizer's BOS/EOS token)")
    p.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens)
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=d.top_k, help="0 = no top-k filter")
    p.add_argument("--top-p", type=float, default=d.top_p, help="1 = no nucleus filter")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--no-cache", action="store_true", help="recompute the whole context at "
                   "every step instead of using the KV cache (slower, same output)")
    p.add_argument("--show-probs", type=int, default=0, metavar="K",
                   help="after each token, print the K most likely next tokens and their "
                        "probabilities")
    p.add_argument("--engine", choices=("torch", "numpy"), default="torch")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    p.set_defaults(func=run)


def validate(args: argparse.Namespace) -> SampleConfig:
    checks = [(args.max_new_tokens >= 0, "--max-new-tokens must be >= 0"),
              (args.temperature >= 0, "--temperature must be >= 0"),
              (args.top_k >= 0, "--top-k must be >= 0"),
              (0 < args.top_p <= 1, "--top-p must be in (0, 1]"),
              (args.show_probs >= 0, "--show-probs must be >= 0")]
    for ok, message in checks:
        if not ok:
            raise UserError(message)
    return SampleConfig(args.max_new_tokens, args.temperature, args.top_k, args.top_p, args.seed)


def prompt_ids(tokenizer, text: str) -> list[int]:
    unknown = tokenizer.count_unknown(text)
    if unknown:
        print(f"sheepop: warning: {unknown} piece(s) of the prompt are not in the vocabulary "
              f"and map to the unknown token", file=sys.stderr)
    ids = tokenizer.encode(text)
    if not ids:
        start = tokenizer.bos_id if tokenizer.bos_id is not None else tokenizer.eos_id
        if start is None:
            raise UserError("an empty prompt needs a tokenizer with a BOS or EOS token: "
                            "give --prompt")
        ids = [start]
    return ids


def run(args: argparse.Namespace) -> int:
    from sheepop.cli.run import language_model, load_run
    from sheepop.generate import generate
    from sheepop.tokenizers import IncrementalDecoder
    sample_cfg = validate(args)
    cfg, tokenizer, weights = load_run(args.run_dir)
    text = sys.stdin.read() if args.prompt == "-" else args.prompt
    ids = prompt_ids(tokenizer, text)
    lm = language_model(cfg, weights, args.engine, args.device)
    decoder = IncrementalDecoder(tokenizer)
    out = sys.stdout
    out.write(text)
    steps = generate(lm, ids, sample_cfg, use_cache=not args.no_cache,
                     eos_id=tokenizer.eos_id, show_probs=args.show_probs)
    for step in steps:
        if args.show_probs:
            shown = ", ".join(f"{tokenizer.id_to_token(i)!r} {p:.3f}" for i, p in step.top)
            out.write(f"\n  -> {tokenizer.id_to_token(step.token)!r}   next: {shown}")
        elif step.token != tokenizer.eos_id:
            out.write(decoder.step(step.token))
        out.flush()
    out.write(decoder.flush() + "\n")
    return 0
