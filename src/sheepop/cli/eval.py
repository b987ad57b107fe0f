"""`sheepop eval RUN_DIR --data PATH`: loss, perplexity and bits per byte of a trained model on
any text.

Bits per byte (sheepop.tokenizers.token_bytes) counts the UTF-8 bytes of exactly the targets
scored: with --max-windows, only the windows evaluated. Over raw text these are the text's own
bytes: characters the tokenizer lacks (an <|unk|>, a dropped byte) still count theirs
(`scored_text_bytes`), and are warned about on stderr, with the commonest of them.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from sheepop.cli.common import (
    HelpFormatter,
    add_best_option,
    add_dtype_option,
    add_threads_option,
    model_dir,
)
from sheepop.config.schema import INFERENCE_ENGINES
from sheepop.errors import UserError
from sheepop.words import plural


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "eval", help="loss, perplexity and bits per byte on a text",
        description="Mean cross-entropy (nats/token), perplexity exp(loss) and bits per byte "
                    "(all the nats over ln 2 times the UTF-8 bytes of the text scored, the "
                    "bytes of characters the tokenizer lacks included, which a warning on "
                    "stderr counts and shows: the "
                    "figure that compares models with different tokenizers; "
                    "docs/math/08-loss.md) of a trained model on DATA, cut into "
                    "non-overlapping windows of the model's context. --json prints one object "
                    "with the keys loss, perplexity (null past float64's range, a loss over "
                    "709.78), bits_per_byte (null when the targets hold no text), tokens "
                    "(targets scored), bytes and windows.",
        formatter_class=HelpFormatter)
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory made by `sheepop train` "
                   "(or its best/ or checkpoints/step-N/ folder)")
    add_best_option(p)
    p.add_argument("--data", required=True, metavar="PATH",
                   help="a text file, a folder of text, or a prepared data directory (its val "
                        "split)")
    p.add_argument("--engine", choices=INFERENCE_ENGINES, default="auto",
                   help="the engine that runs the model; auto: the one measured faster for "
                        "the model's size, dtype and threads (printed at start-up; "
                        "docs/performance.md)")
    add_dtype_option(p)
    p.add_argument("--max-windows", type=int, default=2000,
                   help="evaluate at most this many windows (evenly spread)")
    p.add_argument("--batch-size", type=int, default=16,
                   help="windows per forward pass (memory, not the result)")
    p.add_argument("--json", action="store_true",
                   help="print the figures as one JSON object instead of a sentence")
    add_threads_option(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import numpy as np  # here, not at the top: the command line loads without it

    from sheepop.data.dataset import load_dataset
    from sheepop.data.windows import eval_windows
    from sheepop.inference.load import load
    from sheepop.tokenizers.token_bytes import (
        TargetBytes,
        bits_per_byte,
        perplexity,
        scored_text_bytes,
    )
    from sheepop.tokenizers.unknown import unknown_warning
    for name, value in (("--max-windows", args.max_windows), ("--batch-size", args.batch_size)):
        if value < 1:
            raise UserError(f"{name} must be at least 1, not {value}")
    model = load(model_dir(args), args.engine, dtype=args.dtype)
    cfg, tokenizer = model.config, model.tokenizer
    cfg.data.val_fraction = 0.0
    data = load_dataset(args.data, cfg.data, tokenizer)
    if data.unknown and (warning := unknown_warning(tokenizer, data.unknown, "the data")):
        print(f"sheepop: {warning}", file=sys.stderr)
    tokens = data.val if len(data.val) > 1 else data.train
    pad = tokenizer.pad_id if tokenizer.pad_id is not None else 0
    x, y = eval_windows(np.asarray(tokens), cfg.model.block_size, args.max_windows, pad)
    total, count = 0.0, 0
    for i in range(0, len(x), args.batch_size):
        s, n = model.loss_sum(x[i:i + args.batch_size], y[i:i + args.batch_size])
        total, count = total + s, count + n
    n_bytes = scored_text_bytes(TargetBytes(tokenizer), x, y, tokens, data.text_bytes)
    loss, bpb = total / max(count, 1), bits_per_byte(total, n_bytes)
    ppl = perplexity(loss)
    if args.json:
        print(json.dumps({"loss": loss, "perplexity": ppl if math.isfinite(ppl) else None,
                          "bits_per_byte": bpb, "tokens": count, "bytes": n_bytes,
                          "windows": len(x)}))
        return 0
    per_byte = f"{bpb:.4f} bits/byte" if bpb is not None else "no bytes of text to count"
    print(f"{plural(count, 'token')} ({plural(n_bytes, 'byte')}) in {plural(len(x), 'window')}: "
          f"loss {loss:.4f} nats/token, perplexity {ppl:.3f}, {per_byte}")
    return 0
