"""A corpus of hostile checkpoints, configs and tokenizer files (issue 13, item 7): each is
refused with one line (a UserError; exit status 2 through the command line) naming what is
wrong, before anything big is allocated, in bounded time. The files are made here, from one
real tiny run; nothing binary is committed.

Through the real command line (`generate`, `train --resume`, `eval`) for a handful, through
the Python loaders (`sheepop.inference.load.read_run`, `sheepop.checkpoint.format`,
`sheepop.tokenizers`) for the rest. A FIFO is opened in a child process with a timeout, so a
regression hangs the child, not the test run.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from cli_refusal import fails
from safetensors.numpy import save as st_save
from tiny_run import TEXT, train_tiny_run
from variants import RMSNORM, ROPE, SWIGLU, gqa, llama

from sheepop.checkpoint import format as checkpoint
from sheepop.checkpoint.check import check_weights_file, weights_from_bytes
from sheepop.config.model_size import MAX_LAYERS, check_model_size, memory_bytes, param_count
from sheepop.config.schema import Config, ModelConfig
from sheepop.errors import UserError
from sheepop.inference import load as inference
from sheepop.scratch.init import param_shapes
from sheepop.tokenizers import loads, train_tokenizer


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A real run (tiny_run.train_tiny_run), context 16."""
    return train_tiny_run(tmp_path_factory.mktemp("hostile"), block_size=16)


@pytest.fixture
def copy(run, tmp_path) -> Path:
    """A fresh copy of the run to spoil."""
    return Path(shutil.copytree(run, tmp_path / "run"))


def set_config(run_dir: Path, change) -> None:
    path = run_dir / checkpoint.CONFIG_FILE
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def set_model(**values):
    return lambda d: d["model"].update(values)


def refused(call, prefix: str) -> str:
    """`call()` raises one UserError line that contains `prefix`; its message."""
    with pytest.raises(UserError) as e:
        call()
    message = str(e.value)
    assert prefix in message and "\n" not in message and len(message) < 400, message
    return message


def child_cli(argv: list[str], timeout: float = 60) -> tuple[int, str, float]:
    """`python -m sheepop ARGV` in a child process: (status, stderr, seconds)."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "sheepop", *argv], capture_output=True,
                          text=True, timeout=timeout)
    return proc.returncode, proc.stderr, time.perf_counter() - start


# ----- config.json: wrong values, nesting, sizes ------------------------------------------------

CONFIG_CASES = [
    ("activation", set_model(activation="evil"),
     "model.activation must be one of gelu, gelu_tanh, relu, relu2, silu, not 'evil'"),
    ("activation-list", set_model(activation=["evil"]), "model.activation expects str"),
    ("dropout", set_model(dropout=2), "model.dropout must be in [0, 1)"),
    ("n_layer", set_model(n_layer=-1), "model.n_layer must be at least 1"),
    ("n_head-0", set_model(n_head=0), "model.n_head must be at least 1"),
    ("version", lambda d: d.update(version="1"), "has no valid version number"),
    ("config_version", lambda d: d.update(config_version="1"),
     "config_version must be a positive integer, not '1'"),
    ("pos_scale-nan", set_model(pos_scale=math.nan), "model.pos_scale must be a finite number"),
    ("ln_eps-0", set_model(ln_eps=0), "model.ln_eps must be positive"),
    ("ln_eps-inf", set_model(ln_eps=math.inf), "model.ln_eps must be a finite number"),
    ("lr-inf", lambda d: d["train"].update(lr=math.inf), "train.lr must be a finite number"),
    ("lr-huge-int", lambda d: d["train"].update(lr=10**400), "train.lr expects float"),
    ("beta2", lambda d: d["train"].update(beta2=1.0), "train.beta1 and beta2 must be in [0, 1)"),
    ("seed", lambda d: d["train"].update(seed=-1), "train.seed must be in [0, 2^63)"),
    ("sample seed", lambda d: d["sample"].update(seed=-2), "sample.seed must be in [0, 2^63), "
                                                           "or -1"),
    ("top_p", lambda d: d["sample"].update(top_p=0.0), "sample.top_p must be in (0, 1]"),
    ("block_size", set_model(block_size=10**12), "the model would need"),
    ("n_embd", set_model(n_embd=2**40, n_head=1), "the model would need"),
    ("n_layer-huge", set_model(n_layer=10**9), "model.n_layer is 1,000,000,000, more than "
                                               f"sheepop builds ({MAX_LAYERS})"),
    ("long-string", set_model(activation="x" * 10**6), "not 'xxxxxxxx"),
]


@pytest.mark.parametrize("change, prefix", [c[1:] for c in CONFIG_CASES],
                         ids=[c[0] for c in CONFIG_CASES])
def test_a_hostile_config_is_refused_by_the_loader(copy, change, prefix):
    set_config(copy, change)
    refused(lambda: inference.read_run(copy), prefix)


def test_deeply_nested_json_is_one_line(copy):
    (copy / checkpoint.CONFIG_FILE).write_text("[" * 100_000)
    refused(lambda: checkpoint.load_config(copy), "is not a JSON file sheepop reads (nested "
                                                  "too deeply)")
    (copy / checkpoint.TOKENIZER_FILE).write_text('{"a": ' * 100_000)
    refused(lambda: loads((copy / checkpoint.TOKENIZER_FILE).read_text(), "tok.json"),
            "tok.json is not a JSON file sheepop reads (nested too deeply)")


def test_the_command_line_refuses_hostile_configs_at_once(copy, capsys):
    set_config(copy, set_model(activation="evil"))
    fails(capsys, ["generate", str(copy), "--prompt", "the"], "model.activation must be")
    set_config(copy, set_model(activation="gelu", pos_scale=math.nan))
    fails(capsys, ["eval", str(copy), "--data", str(copy.parent / "x.txt")],
                "model.pos_scale must be a finite number")


@pytest.mark.parametrize("change, prefix", [
    (set_model(n_layer=10**9), "more than sheepop builds"),
    (set_model(block_size=10**12), "the model would need"),
    (None, "is not a JSON file sheepop reads (nested too deeply)"),
], ids=["n_layer-1e9", "block_size-1e12", "nested"])
def test_generate_and_resume_refuse_at_once_in_bounded_memory(copy, change, prefix):
    """Today's tracebacks and unbounded growth (n_layer = 10**9 grew +20 MB/s until killed),
    through the real command line in a child process."""
    if change is None:
        (copy / checkpoint.CONFIG_FILE).write_text("[" * 100_000)
    else:
        set_config(copy, change)
    data = copy.parent / "data.txt"
    data.write_text(TEXT)
    for argv in (["generate", str(copy), "--prompt", "the", "--device", "cpu"],
                 ["train", str(data), "--resume", "--out", str(copy), "--steps", "3"]):
        status, err, _ = child_cli(argv)
        assert status == 2 and len(err.splitlines()) == 1 and prefix in err, err


# ----- model.safetensors: values, dtypes, shapes, a lying header --------------------------------


def weights_of(run_dir: Path) -> dict[str, np.ndarray]:
    return checkpoint.load_weights(run_dir)


def write_weights(run_dir: Path, weights: dict[str, np.ndarray]) -> None:
    (run_dir / checkpoint.MODEL_FILE).write_bytes(st_save(weights))


def changed(run_dir: Path, name: str, value) -> None:
    weights = weights_of(run_dir)
    weights[name] = value(weights[name])
    write_weights(run_dir, weights)


@pytest.mark.parametrize("value, prefix", [
    (lambda w: np.full_like(w, np.nan), "tensor 'ln_f.weight' holds 16 NaN or infinite values "
                                        "(of 16)"),
    (lambda w: np.where(np.arange(w.size).reshape(w.shape) == 3, np.inf, w).astype(np.float32),
     "tensor 'ln_f.weight' holds 1 NaN or infinite values"),
    (lambda w: w > 0, "tensor 'ln_f.weight' is BOOL; weights must be floating point"),
    (lambda w: w.astype(np.int64), "tensor 'ln_f.weight' is I64; weights must be floating"),
    (lambda w: w.astype(np.float64) * 1e300, "tensor 'ln_f.weight' holds 16 NaN or infinite"),
    (lambda w: w[:8], "ln_f.weight has shape (8,), the config expects (16,)"),
], ids=["all-nan", "one-inf", "bool", "int64", "f64-past-f32", "shape"])
def test_bad_weights_are_refused_naming_the_tensor(copy, value, prefix):
    changed(copy, "ln_f.weight", value)
    refused(lambda: inference.read_run(copy), prefix)


def test_half_precision_weights_are_converted_to_float32(copy):
    before = weights_of(copy)
    write_weights(copy, {k: v.astype(np.float16) for k, v in before.items()})
    _, _, after = inference.read_run(copy)
    assert all(after[k].dtype == np.float32 for k in after)
    assert np.allclose(after["ln_f.weight"], before["ln_f.weight"], atol=1e-3)
    # bfloat16: the top 16 bits of a float32 (no NumPy dtype; written by hand)
    raw = {k: (v.view(np.uint32) >> 16).astype(np.uint16) for k, v in before.items()}
    data = st_save(raw)
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    for entry in header.values():
        entry["dtype"] = "BF16"
    (copy / checkpoint.MODEL_FILE).write_bytes(header_file(header, data[8 + n:]))
    bf16 = inference.read_run(copy)[2]
    assert np.allclose(bf16["ln_f.weight"], before["ln_f.weight"], rtol=1e-2)


def test_missing_and_unexpected_tensors_are_refused_before_reading(copy):
    weights = weights_of(copy)
    del weights["ln_f.bias"]
    write_weights(copy, dict(weights, **{"evil": np.zeros(3, np.float32)}))
    refused(lambda: inference.read_run(copy), "does not match the model config: missing "
                                              "['ln_f.bias'], unexpected [\"'evil'\"]")


def header_file(header: dict | bytes, data: bytes = b"", length: int | None = None) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return (len(raw) if length is None else length).to_bytes(8, "little") + raw + data


LYING_HEADERS = [
    ("short", b"\x01\x02", "is not a valid safetensors file (only 2 bytes)"),
    ("length-past-end", header_file({}, length=2**62), "its header claims"),
    ("not-json", header_file(b"{nope"), "(safetensors header) is not valid JSON"),
    ("nested", header_file(b"[" * 100_000), "nested too deeply"),
    ("not-object", header_file([1, 2]), "the safetensors header is not a JSON object"),
    ("dtype", header_file({"t": {"dtype": "F99", "shape": [1], "data_offsets": [0, 4]}},
                          b"\0" * 4), "tensor 't' has an unknown dtype 'F99'"),
    ("shape", header_file({"t": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}},
                          b"\0" * 4), "tensor 't' has no valid shape ([-1])"),
    ("offsets-past-end", header_file({"t": {"dtype": "F32", "shape": [10**9],
                                            "data_offsets": [0, 4 * 10**9]}}, b"\0" * 4),
     "tensor 't' ends at byte 4,000,000,000 of the data, past the end of the file"),
    ("offsets-backwards", header_file({"t": {"dtype": "F32", "shape": [1],
                                             "data_offsets": [4, 0]}}, b"\0" * 4),
     "tensor 't' has no valid data_offsets"),
    ("shape-vs-bytes", header_file({"t": {"dtype": "F32", "shape": [3],
                                          "data_offsets": [0, 4]}}, b"\0" * 4),
     "tensor 't': its shape (3,) of F32 does not fill its 4 bytes"),
]


@pytest.mark.parametrize("data, prefix", [c[1:] for c in LYING_HEADERS],
                         ids=[c[0] for c in LYING_HEADERS])
def test_a_lying_safetensors_header_is_refused(copy, data, prefix):
    (copy / checkpoint.MODEL_FILE).write_bytes(data)
    refused(lambda: weights_from_bytes(data, "m.safetensors"), prefix)
    refused(lambda: checkpoint.load_weights(copy), prefix)
    refused(lambda: inference.read_run(copy), prefix)


def test_the_header_is_checked_against_the_config_before_tensors_are_read(copy):
    """A header that promises the right tensors but a file cut short: the shapes pass, and the
    offsets are refused without reading a tensor."""
    full = (copy / checkpoint.MODEL_FILE).read_bytes()
    (copy / checkpoint.MODEL_FILE).write_bytes(full[:-100])
    cfg = Config.from_saved(checkpoint.load_config(copy), "c").model
    refused(lambda: check_weights_file(copy / checkpoint.MODEL_FILE, param_shapes(cfg)),
            "past the end of the file")


# ----- files that are not regular files, or too big ---------------------------------------------

LOADERS = {
    checkpoint.MODEL_FILE: "load_weights",
    checkpoint.CONFIG_FILE: "load_config",
    checkpoint.TOKENIZER_FILE: "load_tokenizer_json",
    checkpoint.TRAINER_JSON: "load_trainer_state",
}


def child_load(run_dir: Path, name: str) -> tuple[str, float]:
    """Load `name` of `run_dir` in a child process (a hang must not hang the tests): the
    UserError message and the seconds the load call itself took."""
    code = ("import sys, time, json\n"
            "from sheepop.checkpoint import format as checkpoint\n"
            "from sheepop.errors import UserError\n"
            "start = time.perf_counter()\n"
            "try:\n"
            f"    checkpoint.{LOADERS[name]}(sys.argv[1]); message = 'loaded'\n"
            "except UserError as e:\n"
            "    message = str(e)\n"
            "print(json.dumps([message, time.perf_counter() - start]))\n")
    proc = subprocess.run([sys.executable, "-c", code, str(run_dir)], capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    message, seconds = json.loads(proc.stdout)
    return message, seconds


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")
@pytest.mark.parametrize("name", list(LOADERS))
def test_a_fifo_in_place_of_a_checkpoint_file_is_refused_without_blocking(copy, name):
    (copy / name).unlink()
    os.mkfifo(copy / name)
    message, seconds = child_load(copy, name)
    assert f"{name} is a FIFO (named pipe), not a" in message, message
    assert seconds < 2, seconds  # the open never waits for a writer


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
@pytest.mark.parametrize("name", list(LOADERS))
def test_a_symlink_to_dev_zero_is_refused_without_reading(copy, name):
    (copy / name).unlink()
    (copy / name).symlink_to("/dev/zero")
    message, seconds = child_load(copy, name)
    assert f"{name} is a character device, not a" in message, message
    assert seconds < 2, seconds


def test_a_directory_in_place_of_a_checkpoint_file(copy):
    for name, loader in LOADERS.items():
        (copy / name).unlink()
        (copy / name).mkdir()
        load = getattr(checkpoint, loader)
        refused(lambda: load(copy), f"{name} is a directory")  # noqa: B023 (called at once)


def test_a_fifo_weights_file_through_the_command_line(copy):
    (copy / checkpoint.MODEL_FILE).unlink()
    os.mkfifo(copy / checkpoint.MODEL_FILE)
    status, err, _ = child_cli(["generate", str(copy), "--prompt", "the", "--device", "cpu"])
    assert status == 2 and len(err.splitlines()) == 1, err
    assert "model.safetensors is a FIFO (named pipe), not a weights" in err, err


@pytest.mark.parametrize("name, prefix", [
    (checkpoint.CONFIG_FILE, "more than a sheepop run config may be (4,194,304 bytes)"),
    (checkpoint.TOKENIZER_FILE, "more than a tokenizer may be (67,108,864 bytes)"),
    (checkpoint.TRAINER_JSON, "more than a trainer state may be (67,108,864 bytes)"),
])
def test_json_files_past_their_size_cap_are_refused_unread(copy, name, prefix):
    with open(copy / name, "r+b") as f:  # sparse: no disk is spent on the hole
        f.truncate(100 * 2**20)
    refused(lambda: getattr(checkpoint, LOADERS[name])(copy), prefix)


# ----- tokenizer.json -------------------------------------------------------------------------


def good_tokenizer(kind: str = "bpe") -> dict:
    return json.loads(train_tokenizer(kind, ["ab ab cd"], **(
        {"vocab_size": 300} if kind == "bpe" else {})).to_json())


@pytest.mark.parametrize("kind, change, prefix", [
    ("char", {"kind": ["char"]}, "unknown tokenizer kind ['char']"),
    ("char", {"kind": {"a": 1}}, "unknown tokenizer kind {'a': 1}"),
    ("word", {"words": ["\ud800"]}, "it holds the lone surrogate '\\ud800'"),
    ("char", {"special_tokens": {"<|bos|>": 10**20}}, "exactly 0..vocab_size-1"),
    ("char", {"special_tokens": {"<|bos|>": -1}}, "exactly 0..vocab_size-1"),
    ("char", {"special_tokens": {"<|bos|>": True}}, "map token strings to integer ids"),
    ("bpe", {"special_tokens": {"<|endoftext|>": 10**9}}, "special token's id"),
    ("bpe", {"merges": [["Ā", "ā"]]}, "does not join two tokens"),
    ("bpe", {"tokens": ["x" * 10**6]}, "special token's id"),
    ("bpe", {"kind": "x" * 10**6}, "unknown tokenizer kind 'xxxx"),
    ("digits", {"alphabet": ["0"] * 10**5}, "digits alphabet must be"),
])
def test_hostile_tokenizer_files(kind, change, prefix):
    refused(lambda: loads(json.dumps(dict(good_tokenizer(kind), **change)), "t.json"), prefix)


def test_a_tokenizer_that_does_not_fit_the_model_is_refused(copy):
    (copy / checkpoint.TOKENIZER_FILE).write_text(json.dumps(good_tokenizer("char")))
    refused(lambda: inference.read_run(copy), "tokenizer has 9 ids but the model 32")


# ----- the size rule ----------------------------------------------------------------------------


@pytest.mark.parametrize("options", [
    {}, {"pos_encoding": "learned", "tie_weights": False, "head_bias": True},
    {"bias": False, "d_ff": 40, "n_layer": 3}, {"n_head": 1, "n_embd": 6, "vocab_size": 1},
    {**RMSNORM, "bias": False},
    SWIGLU, {**SWIGLU, "bias": False, "d_ff": 40},
    gqa(4, 1), {**gqa(4, 2), **ROPE},
    llama(n_kv_head=1),
    {**gqa(4, 2), "value_embeds": 2, "n_layer": 5, "unet_skips": True},
])
def test_the_parameter_count_is_exact_for_both_engines(options):
    import torch

    from sheepop.model import GPT
    cfg = ModelConfig(**{"vocab_size": 37, "block_size": 8, "n_layer": 2, "n_head": 2,
                         "n_embd": 16, **options})
    assert param_count(cfg) == sum(math.prod(s) for s in param_shapes(cfg).values())
    torch.manual_seed(0)
    assert param_count(cfg) == GPT(cfg).num_params()


def test_the_size_rule_refuses_what_memory_cannot_hold():
    cfg = ModelConfig(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768,
                      pos_encoding="learned")
    assert param_count(cfg) == 124_439_808  # GPT-2 small
    need = memory_bytes(cfg)
    assert need == 4 * (124_439_808 + 2 * 12 * 1024 * 768)  # + the KV cache of one sequence
    sinusoidal = ModelConfig(**{**cfg.__dict__, "pos_encoding": "sinusoidal"})
    assert memory_bytes(sinusoidal) == need  # the table moves from the parameters to a buffer
    rope = ModelConfig(**{**cfg.__dict__, "pos_encoding": "rope"})
    assert memory_bytes(rope) == need - 4 * 1024 * 768  # no table: the angles are computed
    gqa = ModelConfig(**{**cfg.__dict__, "n_kv_head": 4})  # 4 key/value heads for 12 queries
    assert param_count(gqa) == 124_439_808 - 12 * 2 * (768 * 512 + 512)
    assert memory_bytes(gqa) == 4 * (param_count(gqa) + 2 * 12 * 1024 * 256)  # a third of the cache
    check_model_size(cfg, memory=need)  # exactly enough is enough
    refused(lambda: check_model_size(cfg, memory=need - 1), "the model would need 0.5 GiB "
            "(124,439,808 parameters, context 1,024, width 768, 12 layers) but this machine has")
    Config().validate()  # the defaults fit anywhere
