"""`sheepop steer make|show`: steering vectors (docs/steering.md), and the --steer flag that
`generate`, `chat` and `serve` take.

    sheepop steer make RUN --positive love.txt --negative neutral.txt --layer 10 -o love.safetensors
    sheepop steer show love.safetensors
    sheepop generate RUN --prompt "I think" --steer love.safetensors 4
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from sheepop.cli.common import HelpFormatter, add_threads_option
from sheepop.config.schema import INFERENCE_ENGINES
from sheepop.errors import UserError

POSITIONS_HELP = ("where a prompt's residual is read: mean, the mean over every position but "
                  "the first (the first holds no context and, with an attention sink, a far "
                  "larger norm); last, the last position alone")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("steer", help="make and show steering vectors",
                       description="Make a steering vector from two sets of prompts, or show "
                                   "one. A vector steers `generate`, `chat` and `serve` "
                                   "(--steer): it is added, times a strength, to the residual "
                                   "stream out of its block at every position (docs/steering.md).")
    ops = p.add_subparsers(dest="steer_command", metavar="ACTION")
    m = ops.add_parser(
        "make", help="a vector: the mean residual of positive prompts minus negative ones",
        description="Compute v = mean over the positive prompts of r - mean over the negative "
                    "prompts of r, r a prompt's residual stream out of block LAYER (the hook "
                    "point blocks.LAYER.resid_out), each prompt alone, and save it with the "
                    "layer and the model it was made on (safetensors).",
        formatter_class=HelpFormatter)
    m.add_argument("run_dir", metavar="RUN_DIR", help="the model's run directory")
    m.add_argument("--positive", required=True, metavar="FILE",
                   help="prompts towards which to steer: one a line, or a .jsonl file of "
                        "strings or objects with a \"text\" (or \"prompt\") string")
    m.add_argument("--negative", required=True, metavar="FILE",
                   help="prompts away from which to steer (the same forms)")
    m.add_argument("--layer", type=int, required=True,
                   help="the block whose output the vector is read at and added to (from 0)")
    m.add_argument("--positions", choices=("mean", "last"), default="mean", help=POSITIONS_HELP)
    m.add_argument("-o", "--out", required=True, metavar="FILE",
                   help="where to write the vector (a safetensors file)")
    m.add_argument("--engine", choices=INFERENCE_ENGINES, default="auto",
                   help="the engine that runs the model (the same vector within float32)")
    add_threads_option(m)
    m.set_defaults(func=run_make)
    s = ops.add_parser("show", help="what a saved vector is: layer, model, prompts, norm")
    s.add_argument("vector", metavar="FILE")
    s.set_defaults(func=run_show)


def add_steer_flag(p: argparse.ArgumentParser) -> None:
    """`--steer FILE STRENGTH` of generate and chat (repeatable: the vectors add up)."""
    p.add_argument("--steer", nargs=2, action="append", default=[],
                   metavar=("FILE", "STRENGTH"),
                   help="add STRENGTH times the steering vector in FILE (made by `sheepop "
                        "steer make`) to its block's output at every position, the prompt's "
                        "and the generated (repeatable: the vectors add up; 0 changes "
                        "nothing); see docs/steering.md")


def steering_of(args: argparse.Namespace, model: Any) -> Any:
    """The Steering of --steer for `model` (None without the flag); one line on stderr says
    what steers; a vector of another width or depth is refused in one line."""
    from sheepop.generation.steering import Steering
    terms = []
    for path, raw in args.steer:
        try:
            strength = float(raw)
        except ValueError:
            strength = math.nan
        if not math.isfinite(strength):
            raise UserError(f"--steer {path} {raw}: the strength must be a finite number")
        terms.append((loaded_vector(path, model, args.run_dir), strength))
    if not terms:
        return None
    steering = Steering(tuple(terms))
    print(f"sheepop: steering: {steering.describe()}", file=sys.stderr)
    return steering


def loaded_vector(path: str, model: Any, run_dir: str) -> Any:
    """The vector in `path`, checked against `model` (of run `run_dir`)."""
    from sheepop.generation.steering import read_vector
    vector = read_vector(path)
    vector.check_fits(model.config.model, model_name(run_dir), path)
    return vector


def served_vectors(paths: list[str], model: Any, run_dir: str) -> dict[str, Any]:
    """`sheepop serve --steer FILE...`: name (the file's stem) -> vector, each checked against
    `model`; one line on stderr names them."""
    vectors: dict[str, Any] = {}
    for path in paths:
        name = Path(path).stem
        if name in vectors:
            raise UserError(f"--steer {path}: a vector named {name!r} is given already (a "
                            "request names a vector by its file's name)")
        vectors[name] = loaded_vector(path, model, run_dir)
    if vectors:
        print("sheepop: steering vectors a request may name: " + ", ".join(
            f"{name} ({v.describe()})" for name, v in vectors.items()), file=sys.stderr)
    return vectors


def model_name(run_dir: str) -> str:
    """A model's name in a vector: its run directory's (best/ and step-N/ name their run's)."""
    path = Path(run_dir).resolve()
    if path.name == "best" or path.parent.name == "checkpoints":
        path = path.parent if path.name == "best" else path.parent.parent
    return path.name


def run_make(args: argparse.Namespace) -> int:
    from sheepop.inference.load import load
    from sheepop.inference.steer import make_vector, read_prompts
    positive, negative = read_prompts(args.positive), read_prompts(args.negative)
    model = load(args.run_dir, args.engine)
    vector = make_vector(model, model_name(args.run_dir), positive, negative, args.layer,
                         args.positions)
    vector.save(args.out)
    print(f"sheepop: wrote {args.out}: {describe(vector)}", file=sys.stderr)
    return 0


def describe(vector: Any) -> str:
    import numpy as np
    norm = float(np.linalg.norm(vector.vector.astype(np.float64)))
    return (f"{vector.describe()} ({vector.n_layer} layers), residuals read at "
            f"{vector.positions} positions of {vector.positive} positive and {vector.negative} "
            f"negative prompts; |v| = {norm:.4g}")


def run_show(args: argparse.Namespace) -> int:
    from sheepop.generation.steering import read_vector
    print(f"{args.vector}: {describe(read_vector(args.vector))}")
    return 0
