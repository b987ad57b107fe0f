"""Hostile Hugging Face directories (issue 28): each is refused by `sheepop import` with one
line and exit status 2, naming what is wrong, before a run directory is written. The
directories are exported here from a tiny random sheepop model (Llama and GPT-2 shaped), then
spoiled one field at a time; an 8 GiB weights file is a sparse file, so nothing big is written
or read."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save
from variants import llama

from sheepop.checkpoint import format as checkpoint
from sheepop.cli import main
from sheepop.config.schema import Config, ModelConfig
from sheepop.interop import export_gpt2, export_llama
from sheepop.scratch.init import param_shapes
from sheepop.tokenizers import train_tokenizer

TEXT = "the quick brown fox jumps over the lazy dog. " * 40


def tiny(kind: str, vocab: int) -> ModelConfig:
    if kind == "llama":
        return ModelConfig(vocab_size=vocab, block_size=16, n_layer=1, n_head=2, n_embd=16,
                           d_ff=24, **llama(tie_weights=True))
    return ModelConfig(vocab_size=vocab, block_size=16, n_layer=1, n_head=2, n_embd=16,
                       pos_encoding="learned", activation="gelu_tanh", bias=True,
                       tie_weights=True, head_bias=False, norm="layernorm")


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, Path]:
    """kind -> a Hugging Face directory exported from a random tiny sheepop model."""
    root = tmp_path_factory.mktemp("hf")
    tok = train_tokenizer("bpe", [TEXT], vocab_size=300)
    rng = np.random.default_rng(0)
    dirs = {}
    for kind, export in (("llama", export_llama), ("gpt2", export_gpt2)):
        config = Config()
        config.model = tiny(kind, tok.vocab_size)
        weights = {k: (rng.standard_normal(s) * 0.1).astype(np.float32)
                   for k, s in param_shapes(config.model).items()}
        checkpoint.save_checkpoint(root / f"run-{kind}", weights, config.to_dict(),
                                   tok.to_json())
        export(root / f"run-{kind}", root / kind)
        dirs[kind] = root / kind
    return dirs


def edit_json(name: str, change):
    def spoil(d: Path) -> None:
        data = json.loads((d / name).read_text())
        change(data)
        (d / name).write_text(json.dumps(data))
    return spoil


def sharded(weight_map):
    """The weights moved to a shard, and an index whose weight_map is `weight_map`."""
    def spoil(d: Path) -> None:
        (d / "model.safetensors").rename(d / "shard.safetensors")
        (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return spoil


def weights(change):
    def spoil(d: Path) -> None:
        state = dict(st_load((d / "model.safetensors").read_bytes()))
        change(state)
        (d / "model.safetensors").write_bytes(st_save(state))
    return spoil


def merges(first):
    return edit_json("tokenizer.json", lambda t: t["model"]["merges"].insert(0, first))


def padded_to_8_gib(d: Path) -> None:
    with open(d / "model.safetensors", "r+b") as f:
        f.truncate(8 * 2**30)  # sparse: costs no disk and, refused unread, no memory


def set_item(key, value):
    return lambda data: data.__setitem__(key, value)


CASES = [
    ("weight_map a list", "llama", sharded(["shard.safetensors"]),
     "weight_map is not an object"),
    ("weight_map holds an int", "llama", sharded({"model.norm.weight": 3}),
     "weight_map names the file 3, not a file name"),
    ("weight_map holds a list", "llama", sharded({"model.norm.weight": ["shard.safetensors"]}),
     "weight_map names the file ['shard.safetensors']"),
    ("weight_map outside", "llama", sharded({"model.norm.weight": "../gpt2/model.safetensors"}),
     "which is outside"),
    ("merges of ints", "llama", merges([1, 2]), "merge 0 must be"),
    ("merges nested", "llama", merges([["t"], "h"]), "merge 0 must be"),
    ("merge an int", "gpt2", merges(5), "merge 0 must be"),
    ("special token without content", "llama",
     edit_json("tokenizer.json", lambda t: t["added_tokens"].append({"id": 299, "special": True})),
     "must have a non-negative integer 'id' and a non-empty string 'content'"),
    ("8 GiB weights file", "llama", padded_to_8_gib, "bytes after its last tensor"),
    ("NaN weight", "llama", weights(lambda w: w["model.norm.weight"].__setitem__(3, np.nan)),
     "tensor 'model.norm.weight' holds 1 NaN or infinite values"),
    ("infinite weight", "gpt2",
     weights(lambda w: w["transformer.h.0.mlp.c_fc.weight"].__setitem__((0, 0), np.inf)),
     "tensor 'transformer.h.0.mlp.c_fc.weight' holds 1 NaN or infinite values"),
    ("wrong-shape GPT-2 weight", "gpt2",
     weights(set_item("transformer.ln_f.bias", np.zeros(17, np.float32))),
     "transformer.ln_f.bias has shape (17,), the config says (16,)"),
    ("wrong-shape GPT-2 head", "gpt2",
     weights(set_item("lm_head.weight", np.zeros((300, 15), np.float32))),
     "lm_head.weight has shape (300, 15)"),
    ("int64 weight", "llama", weights(set_item("model.norm.weight", np.ones(16, np.int64))),
     "tensor 'model.norm.weight' is I64; weights must be floating point"),
    ("more numbers than the model", "llama",
     weights(set_item("extra", np.zeros(10**6, np.float32))),
     "more than the"),
    ("yarn beside default rope_parameters", "llama",
     edit_json("config.json", set_item("rope_scaling", {"rope_type": "yarn", "factor": 4.0})),
     "rope_scaling is set"),
]


@pytest.mark.parametrize("kind, spoil, prefix", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_import_refuses_a_hostile_directory_with_one_line(exported, tmp_path, capsys, kind,
                                                          spoil, prefix):
    hf_dir = Path(shutil.copytree(exported[kind], tmp_path / kind))
    shutil.copytree(exported["gpt2"], tmp_path / "gpt2", dirs_exist_ok=True)  # "outside"
    spoil(hf_dir)
    assert main(["import", str(hf_dir), str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sheepop: error:") and len(err.splitlines()) == 1, err
    assert prefix in err, err
    assert not (tmp_path / "run" / checkpoint.CONFIG_FILE).exists()


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_the_unspoiled_directories_import(exported, tmp_path, capsys, kind):
    """The same directories, unspoiled, import with the weights exported (so each refusal above
    is the spoiled field's)."""
    hf_dir = Path(shutil.copytree(exported[kind], tmp_path / kind))
    assert main(["import", str(hf_dir), str(tmp_path / "run")]) == 0
    back = checkpoint.load_weights(tmp_path / "run")
    ours = checkpoint.load_weights(exported[kind].parent / f"run-{kind}")
    assert back.keys() == ours.keys()
    for name in ours:
        np.testing.assert_array_equal(back[name], ours[name])
