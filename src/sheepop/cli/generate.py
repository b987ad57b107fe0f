"""`sheepop generate RUN_DIR --prompt TEXT`: sample from a trained model, streamed as it goes."""

from __future__ import annotations

import argparse
import sys

from sheepop.cli.common import (
    HelpFormatter,
    add_best_option,
    add_compile_option,
    add_config_flag,
    add_constraint_flags,
    add_dtype_option,
    add_sampling_flags,
    add_set_option,
    add_speculate_flag,
    add_threads_option,
    constraint_spec,
    flag_values,
    model_dir,
    run_config,
    with_fresh_seed,
)
from sheepop.cli.steer import add_steer_flag, steering_of
from sheepop.config.model_size import describe_kv_cache, param_count
from sheepop.config.schema import INFERENCE_ENGINES, SampleConfig
from sheepop.errors import UserError
from sheepop.words import plural


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "generate", help="generate text from a trained model",
        description="Continue a prompt with a trained model. Output is streamed as it is "
                    "produced, on stdout; one line on stderr first says what runs (parameters, "
                    "context, and the KV cache's memory per token of context, e.g. 'KV cache "
                    "2.0 KiB/token (2 of 4 heads)' with grouped-query attention); after the "
                    "text, lines on stderr give the KV cache's memory and the speed (the "
                    "prompt's tokens/s, the time to first token, the generated tokens/s). The "
                    "sampling settings are the run's [sample] section (set at train time "
                    "with --set sample.KEY=VALUE or a [sample] table), then --config's "
                    "[sample] table, then --set, then the flags below; a flag not given "
                    "changes nothing. --temperature 0 is greedy decoding.",
        formatter_class=HelpFormatter)
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory made by `sheepop train` "
                   "(or its best/ or checkpoints/step-N/ folder)")
    add_best_option(p)
    p.add_argument("--prompt", default="", help="text to continue ('-' reads stdin; empty: "
                   "start from the tokenizer's BOS/EOS token)")
    add_sampling_flags(p)
    add_speculate_flag(p)
    run_value = "the run's {key}; default {default}"
    add_config_flag(p, "--slide-chunk", "sample.slide_chunk", note=run_value,
                    help="past the context, a model with absolute positions drops its "
                         "SLIDE_CHUNK oldest tokens at once and refills its cache once per "
                         "SLIDE_CHUNK new tokens (0: "
                         "block_size // 4; 1: always the last block_size tokens, the slowest); "
                         "see docs/inference.md")
    p.add_argument("--config", metavar="FILE", help="a TOML file whose [sample] table applies "
                   "(its other tables are the run's own, fixed by training)")
    add_set_option(p, "sample.top_k=40", "only sample.* keys")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="stop when TEXT appears, without printing it (repeatable; escapes such "
                   "as \\n are understood)")
    add_constraint_flags(p)
    add_steer_flag(p)
    p.add_argument("--no-cache", action="store_true", help="recompute the whole context at "
                   "every step instead of using the KV cache (slower, same output)")
    p.add_argument("--show-probs", type=int, default=0,
                   help="write one line per token instead of the text: the token, then the "
                        "SHOW_PROBS "
                        "most likely tokens of the distribution it was drawn from (after "
                        "temperature, top-k, top-p, min-p) with their probabilities")
    p.add_argument("--engine", choices=INFERENCE_ENGINES, default="auto",
                   help="the engine that runs the model; auto: numpy on the CPU without "
                        "--compile (as fast here or faster, and it starts ~2 s sooner without "
                        "importing torch), else torch")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    add_compile_option(p)
    add_dtype_option(p)
    add_threads_option(p)
    p.set_defaults(func=run)


def validate(args: argparse.Namespace) -> SampleConfig:
    """The sampling settings: the run's [sample], then --config, --set and the flags."""
    from sheepop.inference.load import engine_refusal
    refusal = engine_refusal(args.engine, args.compile)
    checks = [(refusal is None, refusal),
              (not args.stop or not args.show_probs, "--stop cannot be used with --show-probs"),
              (args.show_probs >= 0, "--show-probs must be >= 0")]
    for ok, message in checks:
        if not ok:
            raise UserError(message)
    args.run_dir = model_dir(args)
    cfg = run_config(args.run_dir, args.overrides, args.config, flag_values(args),
                     only=("sample",))
    return cfg.validate().sample


def stop_strings(raw: list[str]) -> list[str]:
    """--stop values with backslash escapes (\\n, \\t, \\u2028) turned into characters."""
    stops = []
    for text in raw:
        try:
            text = text.encode("latin-1", "backslashreplace").decode("unicode_escape")
        except UnicodeDecodeError as e:
            raise UserError(f"--stop {text!r}: bad escape ({e.reason})") from None
        if not text:
            raise UserError("--stop needs a non-empty text")
        stops.append(text)
    return stops


def prompt_ids(tokenizer, text: str) -> list[int]:
    from sheepop.tokenizers.unknown import unknown_warning
    warning = unknown_warning(tokenizer, tokenizer.unknown_pieces(text), "the prompt")
    if warning is not None:
        print(f"sheepop: {warning}", file=sys.stderr)
    ids = tokenizer.encode(text)
    if not ids:
        start = tokenizer.bos_id if tokenizer.bos_id is not None else tokenizer.eos_id
        if start is None:
            raise UserError("an empty prompt needs a tokenizer with a BOS or EOS token: "
                            "give --prompt")
        ids = [start]
    return ids


def model_line(model, dtype: str) -> str:
    """The one line on stderr that says what runs (stdout carries only the text): size,
    context and the KV cache's memory per token of context, in the cache's dtype (bf16 in the
    torch engine's bfloat16; float32 otherwise, the NumPy engine's always)."""
    m = model.config.model
    kv = describe_kv_cache(m, itemsize=2 if dtype == "bfloat16" and model.engine == "torch"
                           else 4)
    return (f"sheepop: model: {param_count(m):,} parameters ({plural(m.n_layer, 'layer')}, context "
            f"{m.block_size}), {kv}; {model.engine} engine, {dtype}")


def run(args: argparse.Namespace) -> int:
    from sheepop.generation.constraint import compile_constraint
    from sheepop.generation.generate import generate
    from sheepop.generation.speculative import Gate
    from sheepop.generation.speed import Stopwatch
    from sheepop.generation.text_stream import stream_text
    from sheepop.inference.load import load
    from sheepop.tokenizers import IncrementalDecoder
    sample_cfg = validate(args)
    stops = stop_strings(args.stop)
    spec = constraint_spec(args)  # (a bad schema file is refused before the model loads)
    model = load(args.run_dir, args.engine, args.device, args.dtype, args.compile)
    print(model_line(model, args.dtype), file=sys.stderr)
    model.lm.steer(steering_of(args, model))
    constraint = compile_constraint(spec, model.tokenizer)
    if constraint is not None and model.tokenizer.eos_id is None:
        raise UserError("--json-schema, --json-object and --regex need a tokenizer with an "
                        "EOS token: the output ends only where the shape is complete")
    state = None if constraint is None else constraint.start({model.tokenizer.eos_id})
    sample_cfg = with_fresh_seed(sample_cfg)  # (said once the model is there to draw from)
    tokenizer, lm = model.tokenizer, model.lm
    text = sys.stdin.read() if args.prompt == "-" else args.prompt
    ids = prompt_ids(tokenizer, text)
    if len(ids) > lm.block_size:  # the loop keeps the last block_size: say so, not silently
        print(f"sheepop: the prompt holds {len(ids):,} tokens, more than the context "
              f"({lm.block_size:,}): the model sees its last {lm.block_size:,}", file=sys.stderr)
    decoder = IncrementalDecoder(tokenizer)
    out = sys.stdout
    out.write(text)
    stopwatch = Stopwatch(min(len(ids), lm.block_size))
    gate = Gate()
    if not args.show_probs:
        for piece in stream_text(lm, ids, sample_cfg, decoder, stop=stops,
                                 eos_id=tokenizer.eos_id, use_cache=not args.no_cache,
                                 stopwatch=stopwatch, constraint=state, gate=gate):
            out.write(piece)
            out.flush()
    else:
        steps = generate(lm, ids, sample_cfg, use_cache=not args.no_cache,
                         eos_id=tokenizer.eos_id, show_probs=args.show_probs,
                         constraint=state, gate=gate)
        for step in stopwatch.watch(steps):
            shown = ", ".join(f"{tokenizer.id_to_token(i)!r} {p:.3f}" for i, p in step.top)
            out.write(f"\n  -> {tokenizer.id_to_token(step.token)!r}   drawn from: {shown}")
            out.flush()
    out.write("\n")
    out.flush()
    kv_line(lm, args.no_cache)
    print(f"sheepop: speed: {stopwatch.speed().line()}", file=sys.stderr)
    if sample_cfg.speculate:
        print(f"sheepop: {gate.line()}", file=sys.stderr)
    return 0


def kv_line(lm, no_cache: bool) -> None:
    """After the text, on stderr: the KV cache's bytes actually allocated (it grows with the
    tokens, sheepop.arch.kv_cache), its peak, and the whole context's figure."""
    if not no_cache:
        from sheepop.arch.kv_cache import describe_memory
        print(f"sheepop: {describe_memory(lm.cache)}", file=sys.stderr)
