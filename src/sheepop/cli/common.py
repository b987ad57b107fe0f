"""Pieces shared by the command modules: the parser and its help format, config options, flags
that set config keys, and loading a run's config (or its best checkpoint's)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from sheepop.config.build import build_config
from sheepop.config.presets import PRESETS
from sheepop.config.schema import Config, SampleConfig, config_field
from sheepop.config.values import field_type
from sheepop.errors import UserError
from sheepop.words import near_match

CONFIG_FLAGS = "config_flags"  # parser default: {dest: "section.key"} of the flags that set keys


class Parser(argparse.ArgumentParser):
    """An argparse parser whose mistakes name the near match: an unknown option of a
    subcommand gets that subcommand's usage and "did you mean --steps?" (the closest of its
    options, difflib), an unknown choice the closest choice; exit status 2 as argparse's."""

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        namespace, extras = super().parse_known_args(args, namespace)
        # The innermost parser that received an unknown argument reports it with its own usage
        # (argparse would hand it up to the top-level parser, whose usage says nothing of it).
        if extras:
            self.error(self._unknown(extras))
        return namespace, extras

    def _unknown(self, extras: list[str]) -> str:
        words = f"unrecognized argument{'s' if len(extras) > 1 else ''}: {' '.join(extras)}"
        options = [o for a in self._actions for o in a.option_strings]
        for extra in extras:
            if extra.startswith("-") and (close := near_match(extra.split("=", 1)[0], options)):
                return f"{words} (did you mean {close}?)"
        return words

    def _check_value(self, action: argparse.Action, value) -> None:
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError as e:
            close = near_match(str(value), action.choices or ())
            if close is None:
                raise
            raise argparse.ArgumentError(action, f"{e.message} (did you mean {close}?)"
                                         ) from None


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default when it says something: not None (such an option takes its
    value from the config, which the help text names), not False (a switch), not an empty
    list or text; nor when the help text already states it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        default, text = action.default, action.help or ""
        if (default is None or default is False or default in ("", []) or "(default" in text
                or default is argparse.SUPPRESS):
            return action.help
        return super()._get_help_string(action)


DEFAULT_PRESET = "tiny"  # what `sheepop train` starts from without --preset
WITH_DEFAULT = "{key}; default: {default}"  # the note of a training flag: what applies without it


def add_config_options(p: argparse.ArgumentParser,
                       default_preset: str | None = DEFAULT_PRESET) -> None:
    p.add_argument("--preset", default=default_preset, metavar="NAME",
                   help=f"start from a preset: {', '.join(PRESETS)} (default: %(default)s)")
    p.add_argument("--config", metavar="FILE", help="a TOML file with [model], [train], [data], "
                   "[sample] tables, applied after the preset (default: none)")
    add_set_option(p)
    p.add_argument("--help-config", action="store_true",
                   help="print every config key with the value that applies (the preset's, "
                        "then --config's, --set's and the flags'), its meaning and its default, "
                        "and exit")
    p.add_argument("--print-config", action="store_true",
                   help="print the config that applies as TOML (what --config FILE reads) and "
                        "exit without training")


def config_origin(args: argparse.Namespace) -> str:
    """What set the config's values besides the defaults, in words: 'the tiny preset, --set'."""
    resume, source = getattr(args, "resume", False), getattr(args, "init_from", None)
    given = ["the run" if resume else f"the {args.preset} preset" if args.preset else "",
             f"the model of {source}" if source and not resume else "",
             "--config" if args.config else "", "--set" if args.overrides else "",
             "the flags" if flag_values(args) else ""]
    return ", ".join(g for g in given if g) or "nothing"


def show_config(args: argparse.Namespace, cfg: Config) -> int:
    """`--help-config` or `--print-config`: print `cfg` (the config that applies); exit 0."""
    from sheepop.cli.show_config import config_toml, describe_values
    print(describe_values(cfg, config_origin(args)) if args.help_config else config_toml(cfg))
    return 0


def add_set_option(p: argparse.ArgumentParser, example: str = "model.n_layer=4",
                   keys: str = "see --help-config for every key") -> None:
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help=f"override one config field, e.g. --set {example} (repeatable); {keys}")


def _applied_default(key: str, f: Any, preset: str | None) -> str:
    """The value of `key` without its flag: `preset`'s where the preset sets it, else the
    field's default ('1500 with the tiny preset', '1337')."""
    section, _, name = key.partition(".")
    if preset is not None and name in PRESETS[preset].get(section, {}):
        return f"{PRESETS[preset][section][name]} with the {preset} preset"
    return f"{f.default}"


def add_config_flag(p: argparse.ArgumentParser, flag: str, key: str, help: str | None = None,
                    note: str = "{key}", preset: str | None = None, **kw: Any) -> None:
    """A flag that sets config key `key` (e.g. --steps for train.steps): its type and its
    choices are the field's, its help the field's unless given, followed by `note` ({key} and
    {default}: the value without the flag, `_applied_default`); not given, it sets nothing."""
    f = config_field(key)
    kind = field_type(f)
    if kind is bool:
        raise TypeError(f"{flag}: a bool config key needs a store_true flag, not a typed one")
    if f.metadata["choices"] and not f.metadata["many"]:  # a list of them: checked by validate
        kw.setdefault("choices", f.metadata["choices"])
    default = _applied_default(key, f, preset)
    action = p.add_argument(flag, type=kind, default=None,
                            help=f"{help or f.metadata['help']} "
                                 f"({note.format(key=key, default=default)})", **kw)
    p.set_defaults(**{CONFIG_FLAGS: {**(p.get_default(CONFIG_FLAGS) or {}), action.dest: key}})


def add_sampling_flags(p: argparse.ArgumentParser, seed_note: str | None = "") -> None:
    """The sampling flags of `generate`, `chat` and `serve`, written once: each sets its [sample]
    key, the run's value (or the default) applying without it; `seed_note`: None for no --seed
    (the server takes a seed per request). Like every option whose value is a number or a
    word, its metavar is its name in capitals (--top-k TOP_K); a path's names what it is
    (RUN_DIR, FILE)."""
    run_value = "the run's {key}; default {default}"
    add_config_flag(p, "--max-new-tokens", "sample.max_new_tokens", note=run_value,
                    help="the most tokens to generate (fewer when the model writes its end of "
                         "text or of its turn, or a --stop text)")
    add_config_flag(p, "--temperature", "sample.temperature", note=run_value)
    add_config_flag(p, "--top-k", "sample.top_k", note=run_value)
    add_config_flag(p, "--top-p", "sample.top_p", note=run_value)
    add_config_flag(p, "--min-p", "sample.min_p", note=run_value)
    if seed_note is not None:
        add_config_flag(p, "--seed", "sample.seed", note=run_value + seed_note,
                        help="the seed of the sampling's random draws: the same seed, prompt "
                             "and settings give the same text; -1: a fresh seed, printed on "
                             "stderr")
    add_config_flag(p, "--repetition-penalty", "sample.repetition_penalty", note=run_value,
                    help="divide the positive logits (multiply the negative) of tokens already "
                         "in the context by REPETITION_PENALTY; 1 = off, 1.1-1.3 discourages "
                         "loops")


def add_speculate_flag(p: argparse.ArgumentParser, server: bool = False) -> None:
    """--speculate K of `generate`, `chat` and `serve` (`server`: where it applies there, and
    that a request's own `speculate` overrides it)."""
    where = ("; a request's 'speculate' field overrides it; the server speculates for a request "
             "while it runs alone (at batch 1)" if server else "")
    add_config_flag(p, "--speculate", "sample.speculate",
                    note="the run's {key}; default {default}",
                    help="speculative decoding by prompt lookup: propose up to SPECULATE tokens "
                         "that followed the text's last words where they occur earlier in the "
                         "prompt or answer, checked in one forward pass; the same greedy "
                         "output, samples of the same distribution; pays where the answer "
                         "copies its prompt (an edit, a quote), pauses itself where proposals "
                         f"are rejected; 0: off{where}; see docs/inference.md")


def with_fresh_seed(sample: SampleConfig) -> SampleConfig:
    """`sample` with a seed: its own, or a fresh one when it is -1, said on
    stderr so the same text can be drawn again (greedy decoding draws nothing: no line)."""
    import dataclasses

    from sheepop.generation.sample import fresh_seed
    if sample.seed >= 0:
        return sample
    seed = fresh_seed()
    if sample.temperature > 0:
        print(f"sheepop: seed {seed} (the same text again: --seed {seed})", file=sys.stderr)
    return dataclasses.replace(sample, seed=seed)


def add_config_switch(p: argparse.ArgumentParser, flag: str, key: str, help: str,
                      value: bool = True) -> None:
    """A switch that sets bool config key `key` to `value` (true: a store_true flag); not
    given, it sets nothing."""
    action = p.add_argument(flag, action="store_true" if value else "store_false", default=None,
                            help=f"{help} ({key}{'' if value else '=false'})")
    p.set_defaults(**{CONFIG_FLAGS: {**(p.get_default(CONFIG_FLAGS) or {}), action.dest: key}})


APPLY_THREADS = "apply_threads"  # parser default: True where cli.main applies --threads itself
SPARE_CORES = "spare_cores"  # parser default: the cores auto leaves to other work


def add_threads_option(p: argparse.ArgumentParser, key: str | None = None, spare: int = 0
                       ) -> None:
    """The one `--threads N` of every command that computes: torch's intra-op threads and the
    NumPy engine's BLAS threads (sheepop.threads); `auto` or 0: the idle cores when it starts.
    With `key` (train.threads, training commands) it sets that config key, applied when the
    engine is built; without it (inference commands) `cli.main` applies it before the command
    runs, and a run's train.threads is not read; `spare`: cores auto leaves to other work (the
    server's HTTP side)."""
    from sheepop.threads import parse_threads
    what = ("threads of the arithmetic (torch's intra-op pool and the NumPy engine's BLAS); "
            "auto or 0: the cores the load average leaves idle at start, or OMP_NUM_THREADS"
            + (f", less {spare} for the HTTP side" if spare else ""))
    if key is None:
        p.add_argument("--threads", type=parse_threads, default=0,
                       help=f"{what} (default: auto)")
        p.set_defaults(**{APPLY_THREADS: True, SPARE_CORES: spare})
        return
    action = p.add_argument("--threads", type=parse_threads, default=None,
                            help=f"{what} ({key})")
    p.set_defaults(**{CONFIG_FLAGS: {**(p.get_default(CONFIG_FLAGS) or {}), action.dest: key}})


def add_best_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--best", action="store_true",
                   help="load the run's best checkpoint (RUN_DIR/best/: the lowest val loss "
                        "of its evaluations) instead of its latest")


DTYPE_HELP = (
    "how the weights are stored (docs/performance.md, 'Weights in fewer bytes'): float32 as "
    "trained; bfloat16: half the bytes a token reads (the torch engine: weights, activations "
    "and KV cache in bf16; the NumPy engine, auto's choice on a CPU: the matrices in bf16, "
    "computed in float32 by compiled kernels); int8: weight-only, every linear layer's and the "
    "head's weight in int8, about a quarter of the bytes: on the NumPy engine in GGUF Q8_0's "
    "blocks of 32 with a float16 scale each (W ~ d q; a model imported from Q8_0 runs on its "
    "own blocks), its inputs rounded to 8 bits a block as llama.cpp's are; on the torch engine "
    "with one scale per output channel (W ~ s q), its inputs in bf16; int4: the "
    "blocks' linear layers in 4-bit groups of 32 with a scale and an offset each (GGUF Q4_1's "
    "layout: a model imported from Q4_1 runs on its own blocks), the head in int8; with int8 "
    "and int4, norms, embedding and KV cache stay float32")


def add_dtype_option(p: argparse.ArgumentParser) -> None:
    from sheepop.config.schema import INFERENCE_DTYPES
    p.add_argument("--dtype", choices=INFERENCE_DTYPES, default="float32", help=DTYPE_HELP)


def add_compile_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--compile", action="store_true", help="torch engine: compile the decode "
                   "step (torch.compile, one block's graph for every layer: seconds the first "
                   "time, then read from inductor's cache; docs/performance.md, 'Compiled "
                   "decoding')")


def model_dir(args: argparse.Namespace) -> str:
    """The directory to load: RUN_DIR, or its best/ with --best (checked: one clear line when
    the run has none), said on stderr with its step and val loss."""
    if not getattr(args, "best", False):
        return args.run_dir
    from sheepop.train.keeping import best_dir, read_best
    path = best_dir(args.run_dir)
    best = read_best(path)
    print(f"sheepop: the best checkpoint of {args.run_dir}: step {best.get('step')}, val loss "
          f"{best.get('val_loss'):.4f} ({path})", file=sys.stderr)
    return str(path)


def flag_values(args: argparse.Namespace) -> dict[str, Any]:
    """{"section.key": value} of the config flags given on the command line (typed values)."""
    return {key: getattr(args, dest) for dest, key in getattr(args, CONFIG_FLAGS, {}).items()
            if getattr(args, dest) is not None}


def run_config(run_dir: str | Path, overrides: list[str] | None = None,
               config_file: str | None = None, values: dict[str, Any] | None = None,
               only: tuple[str, ...] | None = None) -> Config:
    """A run's saved config, then a TOML file, then `--set` overrides, then typed flag values
    (`only`: the sections the file and `--set` may change)."""
    from sheepop.checkpoint import (
        format as checkpoint,  # here: it loads numpy, which most commands never need
    )

    saved = checkpoint.load_config(run_dir)
    cfg = Config.from_saved(saved, str(Path(run_dir) / checkpoint.CONFIG_FILE))
    return build_config(None, config_file, overrides, base=cfg, values=values, only=only)


def add_constraint_flags(p: argparse.ArgumentParser) -> None:
    """--json-schema FILE, --json-object, --regex REGEX: the shape the output must have,
    enforced token by token (sheepop.generation.constraint); at most one of them."""
    shape = p.add_mutually_exclusive_group()
    shape.add_argument("--json-schema", metavar="FILE",
                       help="the output is JSON valid against the JSON schema in FILE (a "
                            "keyword that cannot be enforced is refused by name; "
                            "docs/serve.md, 'Structured output')")
    shape.add_argument("--json-object", action="store_true",
                       help="the output is a JSON object")
    shape.add_argument("--regex", metavar="REGEX",
                       help="the output matches the regular expression REGEX whole")


def constraint_spec(args: argparse.Namespace) -> Any:
    """The ConstraintSpec the constraint flags ask for (None: none), the schema file read and
    checked to be a JSON object (one UserError line otherwise)."""
    from sheepop.files import read_json
    from sheepop.generation.constraint import ConstraintSpec
    if args.json_object:
        return ConstraintSpec("json_object")
    if args.regex is not None:
        return ConstraintSpec("regex", args.regex)
    if args.json_schema is None:
        return None
    schema = read_json(args.json_schema, f"--json-schema {args.json_schema}: no such file",
                       "JSON schema")
    if not isinstance(schema, dict):
        raise UserError(f"--json-schema {args.json_schema}: a JSON schema is a JSON object, "
                        f"not {type(schema).__name__}")
    return ConstraintSpec("json_schema", schema)
