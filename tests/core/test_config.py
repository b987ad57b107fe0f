"""One owner per setting: derived values, the [sample] section, typed flags, allowed values."""

import json
import re
from pathlib import Path

import pytest

from sheepop.cli import build_parser, main
from sheepop.cli.common import flag_values
from sheepop.cli.launch import argv_from_args
from sheepop.cli.train import config_from_args
from sheepop.config import schema as config
from sheepop.config.build import build_config
from sheepop.config.schema import Config, ModelConfig, SampleConfig, resolve_vocab_size
from sheepop.errors import UserError

SRC = Path(__file__).resolve().parents[2] / "src" / "sheepop"
TINY = ["--no-progress", "--steps", "2", "--set", "model.n_layer=1", "--set", "model.n_embd=16",
        "--set", "model.n_head=2", "--set", "model.block_size=16",
        "--set", "train.batch_size=2", "--set", "train.eval_batches=1"]


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "text.txt"
    path.write_text("hello world, hello sheep. " * 200)
    return path


@pytest.fixture(scope="module")
def run_dir(text, tmp_path_factory):
    """A char-level run whose [sample] section asks for 5 greedy tokens (30 steps: enough for
    the end-of-text token to be far from the most likely one)."""
    out = tmp_path_factory.mktemp("runs") / "run"
    assert main(["train", str(text), "--out", str(out), *TINY, "--steps", "30",
                 "--set", "train.lr=0.02", "--set", "train.warmup_steps=0",
                 "--set", "train.eval_interval=0",
                 "--set", "sample.max_new_tokens=5", "--set", "sample.temperature=0"]) == 0
    return out


def saved(run_dir):
    return json.loads((run_dir / "config.json").read_text())


def fails(capsys, argv, *fragments):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("sheepop: error:") and len(err.splitlines()) == 1, err
    for fragment in fragments:
        assert fragment in err, err


def generated(capsys, run_dir, *flags) -> str:
    """What `sheepop generate` adds to the prompt "hello" (char tokenizer: one char a token)."""
    assert main(["generate", str(run_dir), "--prompt", "hello", *flags]) == 0
    out = capsys.readouterr().out
    assert out.startswith("hello") and out.endswith("\n")
    return out[len("hello"):-1]


# model.vocab_size: derived from the tokenizer, never silently overwritten

def test_vocab_size_is_taken_from_the_tokenizer(run_dir):
    from sheepop.tokenizers import load
    tokenizer = load(run_dir / "tokenizer.json")
    assert saved(run_dir)["model"]["vocab_size"] == tokenizer.vocab_size
    assert tokenizer.vocab_size > len(set("hello world, hello sheep. "))  # + special tokens


def test_contradicting_vocab_size_is_an_error_naming_both_numbers(capsys, run_dir, text,
                                                                   tmp_path):
    vocab = saved(run_dir)["model"]["vocab_size"]
    fails(capsys, ["train", str(text), "--out", str(tmp_path / "r"), *TINY,
                   "--set", "model.vocab_size=999"],
          f"model.vocab_size is 999 but the tokenizer has {vocab} ids")
    assert not (tmp_path / "r").exists()


def test_vocab_size_equal_to_the_tokenizers_is_accepted(capsys, run_dir, text, tmp_path):
    vocab = saved(run_dir)["model"]["vocab_size"]
    assert main(["train", str(text), "--out", str(tmp_path / "r"), *TINY,
                 "--set", f"model.vocab_size={vocab}"]) == 0
    assert saved(tmp_path / "r")["model"]["vocab_size"] == vocab
    # resuming reads the saved (derived) value back: equal, so accepted
    assert main(["train", "--resume", "--out", str(tmp_path / "r"), *TINY[:1],
                 "--steps", "3"]) == 0


def test_the_progression_task_derives_vocab_size_context_and_tokenizer(capsys, tmp_path):
    from sheepop.progression.data import Spec, write_dataset
    write_dataset(tmp_path / "data", Spec(count=40, first_max=99, max_difference=9,
                                          max_terms=8, ood_count=2))
    fails(capsys, ["progression", "train", str(tmp_path / "data"), "--out",
                   str(tmp_path / "r"), "--minutes", "0.1", "--no-progress",
                   "--set", "model.vocab_size=5"],
          "model.vocab_size is 5 but the digits tokenizer has")
    # Its context and tokenizer are derived too: a contradicting value is refused, not replaced.
    for setting, message in (("model.block_size=50", "model.block_size is 50 but the "
                              "progression task derives 15"),
                             ("data.tokenizer=char", "data.tokenizer is 'char' but the "
                              "progression task derives 'digits'")):
        fails(capsys, ["progression", "train", str(tmp_path / "data"), "--out",
                       str(tmp_path / "r"), "--steps", "1", "--no-progress", "--set", setting],
              message)
    assert main(["progression", "train", str(tmp_path / "data"), "--out", str(tmp_path / "r"),
                 "--steps", "1", "--no-progress", "--set", "model.block_size=15"]) == 0


def test_resolve_vocab_size():
    model = ModelConfig()
    resolve_vocab_size(model, 65, "the tokenizer")
    assert model.vocab_size == 65
    resolve_vocab_size(model, 65, "the tokenizer")  # a saved run's own value
    with pytest.raises(UserError, match="model.vocab_size is 65 but x.json has 66 ids"):
        resolve_vocab_size(model, 66, "x.json")


# [sample]: what `sheepop generate` uses; flags, --set and --config override it

def test_generate_uses_the_runs_sample_section(capsys, run_dir):
    five = generated(capsys, run_dir)
    assert len(five) == 5
    assert generated(capsys, run_dir, "--seed", "7") == five  # temperature 0 from the run
    assert generated(capsys, run_dir, "--max-new-tokens", "3") == five[:3]
    assert generated(capsys, run_dir, "--set", "sample.max_new_tokens=4") == five[:4]


def test_generate_config_file_then_set_then_flags(capsys, run_dir, tmp_path):
    toml = tmp_path / "sample.toml"
    toml.write_text("[model]\nn_layer = 9\n\n[sample]\nmax_new_tokens = 2\n")
    base = ["--config", str(toml)]
    assert len(generated(capsys, run_dir, *base)) == 2  # [model] is the run's own: skipped
    assert len(generated(capsys, run_dir, *base, "--set", "sample.max_new_tokens=3")) == 3
    assert len(generated(capsys, run_dir, *base, "--set", "sample.max_new_tokens=3",
                         "--max-new-tokens", "1")) == 1


def test_bad_sample_values_exit_2(capsys, run_dir, text, tmp_path):
    gen = ["generate", str(run_dir), "--prompt", "he"]
    fails(capsys, gen + ["--temperature", "-1"], "sample.temperature must be >= 0")
    fails(capsys, gen + ["--top-k", "-2"], "sample.top_k must be >= 0")
    fails(capsys, gen + ["--top-p", "1.5"], "sample.top_p must be in (0, 1]")
    fails(capsys, gen + ["--top-p", "0"], "sample.top_p must be in (0, 1]")
    fails(capsys, gen + ["--repetition-penalty", "0"], "sample.repetition_penalty must be > 0")
    fails(capsys, gen + ["--max-new-tokens", "-1"], "sample.max_new_tokens must be >= 0")
    fails(capsys, gen + ["--set", "sample.top_p=2"], "sample.top_p must be in (0, 1]")
    fails(capsys, gen + ["--set", "model.n_layer=2"], "only sample settings")
    fails(capsys, ["train", str(text), "--out", str(tmp_path / "r"),
                   "--set", "sample.temperature=-0.5"], "sample.temperature must be >= 0")
    assert not (tmp_path / "r").exists()


def test_old_runs_keep_generating_as_before(capsys, run_dir, tmp_path):
    """A config.json written before [sample] was read (no config_version) holds the old
    defaults there, which nothing used: it is ignored, the current defaults apply."""
    old = tmp_path / "old"
    old.mkdir()
    for f in run_dir.iterdir():
        if f.is_file():  # (not best/)
            (old / f.name).write_bytes(f.read_bytes())
    d = saved(run_dir)
    del d["config_version"]
    d["sample"] = {"max_new_tokens": 200, "temperature": 1.0, "top_k": 0, "top_p": 1.0,
                   "seed": 1337, "repetition_penalty": 1.0}
    (old / "config.json").write_text(json.dumps(d))
    cfg = Config.from_saved(d, "config.json")
    assert cfg.sample == SampleConfig() and cfg.sample.temperature == 0.8
    assert cfg.model == Config.from_saved(saved(run_dir), "config.json").model
    assert len(generated(capsys, old, "--max-new-tokens", "4", "--seed", "1")) == 4  # (no EOS)
    d["config_version"] = config.CONFIG_VERSION + 1
    (old / "config.json").write_text(json.dumps(d))
    fails(capsys, ["generate", str(old)], "config_version", "upgrade sheepop")


def test_sample_defaults_are_the_generate_defaults():
    args = build_parser().parse_args(["generate", "r"])
    assert flag_values(args) == {}  # a flag not given overrides nothing
    # llama.cpp's defaults, and a fresh seed each time
    assert SampleConfig() == SampleConfig(max_new_tokens=200, temperature=0.8, top_k=40,
                                          top_p=0.95, min_p=0.05, seed=-1,
                                          repetition_penalty=1.0)


# flags set typed values; build_config takes them besides the --set strings

def test_flags_set_typed_values_after_set_strings():
    argv = ["train", "d", "--steps", "7", "--set", "train.steps=3", "--vocab-size", "300",
            "--dtype", "float32", "--engine", "numpy", "--seed", "5", "--tokenizer", "word"]
    args = build_parser().parse_args(argv)
    values = flag_values(args)
    assert values == {"train.steps": 7, "data.vocab_size": 300, "train.dtype": "float32",
                      "train.engine": "numpy", "train.seed": 5, "data.tokenizer": "word"}
    assert type(values["train.steps"]) is int
    cfg = config_from_args(args)
    assert (cfg.train.steps, cfg.data.vocab_size, cfg.train.engine) == (7, 300, "numpy")
    assert cfg.model.n_layer == 4  # the tiny preset still applies


def test_typed_setter_and_build_config_values():
    cfg = build_config(None, None, ["train.lr=0.5"], values={"train.steps": 9,
                                                            "model.dropout": 0.25})
    assert (cfg.train.lr, cfg.train.steps, cfg.model.dropout) == (0.5, 9, 0.25)
    cfg.set("train.grad_accum", 4)
    cfg.set("model.bias", False)
    assert cfg.train.grad_accum == 4 and cfg.model.bias is False
    for key, bad in (("train.steps", True), ("train.steps", 2.5), ("train.lr", "fast")):
        with pytest.raises(UserError, match=f"{key} expects"):
            cfg.set(key, bad)
    assert Config.from_dict(cfg.to_dict()) == cfg


def test_typed_flags_survive_the_torchrun_relaunch():
    argv = ["train", "data", "--steps", "5", "--dtype", "bfloat16", "--vocab-size", "300",
            "--engine", "numpy", "--nproc", "2", "--set", "train.lr=1e-3"]
    args = build_parser().parse_args(argv)
    again = build_parser().parse_args(["train", *argv_from_args(args.train_parser, args,
                                                                ("nproc",))])
    assert flag_values(again) == flag_values(args)
    assert again.overrides == args.overrides and again.nproc is None


# allowed values: one list each, in config.py

CHOICES = {"train.engine": config.ENGINES, "train.dtype": config.DTYPES,
           "model.pos_encoding": config.POS_ENCODINGS, "model.activation": config.ACTIVATIONS,
           "data.tokenizer": config.TOKENIZER_KINDS, "data.sampling": config.SAMPLING_MODES}


def choice_fields() -> dict[str, tuple[str, ...]]:
    """Every setting that is one of a list, with its allowed values."""
    from dataclasses import fields
    return {f"{section}.{f.name}": f.metadata["choices"]
            for section, cls in config.SECTIONS.items() for f in fields(cls)
            if f.metadata["choices"]}


def test_validate_and_help_read_the_allowed_values_from_one_place():
    assert CHOICES.items() <= choice_fields().items()
    for key, allowed in choice_fields().items():
        f = config.config_field(key)
        assert " | ".join(allowed) in f.metadata["help"]
        cfg = Config()
        cfg.set(key, "nonsense")
        many = config.config_field(key).metadata["many"]  # a comma-separated list of them
        kind = "a comma-separated list of" if many else "one of"
        with pytest.raises(UserError, match=re.escape(f"{key} must be {kind} "
                                                      f"{', '.join(allowed)}, not 'nonsense'")):
            cfg.validate()
        for value in allowed:
            cfg.set(key, value)
            if value in ("rope_terms", "rope_places"):  # digits only (a rule of their own)
                cfg.data.tokenizer = "digits"
            cfg.validate()
    train = build_parser().parse_args(["train"]).train_parser
    options = {a.dest: a.choices for a in train._actions}
    assert options["engine"] == config.ENGINES and options["dtype"] == config.DTYPES
    assert options["tokenizer"] == config.TOKENIZER_KINDS


def test_no_list_of_allowed_values_is_spelled_out_twice():
    from sheepop.tokenizers import KINDS
    assert KINDS is config.TOKENIZER_KINDS
    lists = [v for v in (*choice_fields().values(), config.INFERENCE_DTYPES) if len(v) > 1]
    for path in SRC.rglob("*.py"):
        if path in (SRC / "config" / "schema.py", SRC / "config" / "finetune.py",
                    SRC / "config" / "rl.py"):  # the sections' own files, where lists live
            continue
        code = path.read_text()
        for allowed in lists:
            assert ", ".join(f'"{v}"' for v in allowed) not in code, (path, allowed)


def test_the_llama_preset_matches_tiny_in_size_and_the_modern_settings_are_checked():
    from sheepop.config.model_size import kv_cache_bytes_per_token, param_count
    sizes = {}
    for preset in ("tiny", "tiny-llama"):
        cfg = build_config(preset)
        cfg.model.vocab_size = 65  # the built-in data's characters
        sizes[preset] = param_count(cfg.validate().model)
    assert abs(sizes["tiny-llama"] / sizes["tiny"] - 1) < 0.10, sizes
    llama = build_config("tiny-llama").model
    assert (llama.pos_encoding, llama.norm, llama.ffn, llama.kv_heads, llama.bias,
            llama.tie_weights) == ("rope", "rmsnorm", "swiglu", 2, False, False)
    assert kv_cache_bytes_per_token(llama) == 2 * 4 * 2 * 32 * 4  # 2 of 4 heads: half of tiny's
    assert kv_cache_bytes_per_token(build_config("tiny").model) == 2 * 4 * 128 * 4
    assert build_config("llama-small").validate().model.kv_heads == 4
    assert ModelConfig(ffn="swiglu", n_embd=128).ffn_dim == 320   # 8d/3 = 341 -> 5 x 64
    assert ModelConfig(ffn="swiglu", n_embd=768).ffn_dim == 2048  # Llama's rule of thumb
    assert ModelConfig(ffn="swiglu", n_embd=16).ffn_dim == 64
    assert ModelConfig(n_embd=128).ffn_dim == 512
    for settings, message in [
        (["model.n_kv_head=3"], "model.n_head (4) must be divisible by model.n_kv_head (3)"),
        (["model.n_kv_head=-1"], "model.n_kv_head must be >= 0"),
        (["model.pos_encoding=rope", "model.n_head=4", "model.n_embd=12"],
         "rope rotates pairs: the head width n_embd / n_head (12 / 4) must be even"),
        (["model.pos_encoding=rope", "model.rope_theta=1"], "model.rope_theta must be > 1"),
        (["model.ffn=geglu"], "model.ffn must be one of mlp, swiglu, not 'geglu'"),
        (["model.pos_encoding=alibi"],
         "model.pos_encoding must be one of sinusoidal, learned, rope, rope_terms, rope_places, "
         "none, "
         "not 'alibi'"),
    ]:
        with pytest.raises(UserError, match=re.escape(message)):
            build_config(None, None, settings).validate()
