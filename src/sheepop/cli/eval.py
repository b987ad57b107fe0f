"""`sheepop eval RUN_DIR --data PATH`: loss and perplexity of a trained model on any text."""

from __future__ import annotations

import argparse
import math

import numpy as np

from sheepop.config import ENGINES


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "eval", help="loss and perplexity on a text",
        description="Mean cross-entropy (nats/token) and perplexity exp(loss) of a trained model "
                    "on DATA, cut into non-overlapping windows of the model's context.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--data", required=True, metavar="PATH",
                   help="a text file, a folder of text, or a prepared data directory (its val "
                        "split)")
    p.add_argument("--engine", choices=ENGINES, default="torch")
    p.add_argument("--max-windows", type=int, default=2000,
                   help="evaluate at most this many windows (evenly spread)")
    p.add_argument("--batch-size", type=int, default=16)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sheepop.data.dataset import load_dataset
    from sheepop.data.windows import eval_windows
    from sheepop.inference import load
    model = load(args.run_dir, args.engine)
    cfg, tokenizer = model.config, model.tokenizer
    cfg.data.val_fraction = 0.0
    data = load_dataset(args.data, cfg.data, tokenizer)
    tokens = data.val if len(data.val) > 1 else data.train
    pad = tokenizer.pad_id if tokenizer.pad_id is not None else 0
    x, y = eval_windows(np.asarray(tokens), cfg.model.block_size, args.max_windows, pad)
    total, count = 0.0, 0
    for i in range(0, len(x), args.batch_size):
        s, n = model.loss_sum(x[i:i + args.batch_size], y[i:i + args.batch_size])
        total, count = total + s, count + n
    loss = total / max(count, 1)
    print(f"{count:,} tokens in {len(x)} windows: loss {loss:.4f} nats/token, "
          f"perplexity {math.exp(loss):.3f}")
    return 0
