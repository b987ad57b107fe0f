"""A Hugging Face model's generation_config.json (issue 41, section 2): its sampling fields become
the imported run's [sample] settings and win over sheepop's defaults, a flag wins over both;
do_sample false is greedy; a field that changes the draw and that sheepop does not do is named
in a note; a bad value is refused in one line."""

from __future__ import annotations

import json
import shutil

import pytest
from cli_refusal import fails
from variants import llama

from sheepop.checkpoint import format as checkpoint
from sheepop.cli import main
from sheepop.cli.common import run_config
from sheepop.config.schema import Config, ModelConfig, SampleConfig
from sheepop.errors import UserError
from sheepop.interop import export_llama, import_hf
from sheepop.model import GPT
from sheepop.tokenizers import train_tokenizer

QWEN_LIKE = {"bos_token_id": 151643, "pad_token_id": 151643, "do_sample": True,
             "eos_token_id": [7, 151643], "repetition_penalty": 1.05, "temperature": 0.7,
             "top_p": 0.8, "top_k": 20, "transformers_version": "4.37.0"}


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A tiny Llama exported by sheepop as a Hugging Face directory (its generation_config.json
    holds only BOS and EOS)."""
    root = tmp_path_factory.mktemp("genconf")
    tok = train_tokenizer("bpe", ["the quick brown fox jumps over the lazy dog. " * 20],
                          vocab_size=270)
    cfg = Config()
    cfg.model = ModelConfig(vocab_size=tok.vocab_size, block_size=16, n_layer=1, n_embd=16,
                            n_head=2, d_ff=24, **llama())
    checkpoint.save_checkpoint(root / "run", GPT(cfg.model).numpy_weights(), cfg.to_dict(),
                               tok.to_json())
    export_llama(root / "run", root / "hf")
    return root / "hf"


def with_generation_config(hf_dir, tmp_path, fields) -> str:
    d = tmp_path / "hf"
    shutil.copytree(hf_dir, d)
    (d / "generation_config.json").write_text(json.dumps(fields))
    return d


def test_its_sampling_wins_over_the_defaults_and_a_flag_over_both(hf_dir, tmp_path, capsys):
    d = with_generation_config(hf_dir, tmp_path, {**QWEN_LIKE, "min_p": 0.1,
                                                  "max_new_tokens": 64, "num_beams": 1})
    assert main(["import", str(d), str(tmp_path / "run")]) == 0
    out, err = capsys.readouterr()
    assert ("sampling from the model's generation_config.json: do_sample True, repetition_penalty "
            "1.05, temperature 0.7, top_p 0.8, top_k 20, min_p 0.1, max_new_tokens 64") in out
    # eos 7 also ends an answer in transformers: said (the tokenizer's EOS is another id)
    assert "eos_token_id [7, 151643] also ends an answer in transformers" in err
    sample = run_config(tmp_path / "run").sample
    assert sample == SampleConfig(temperature=0.7, top_k=20, top_p=0.8, min_p=0.1,
                                  repetition_penalty=1.05, max_new_tokens=64)
    saved = checkpoint.load_config(tmp_path / "run")["source"]["generation_config"]
    assert saved["read"]["top_k"] == 20 and len(saved["notes"]) == 1
    flagged = run_config(tmp_path / "run", values={"sample.top_k": 3, "sample.min_p": 0.0})
    assert (flagged.sample.top_k, flagged.sample.min_p, flagged.sample.top_p) == (3, 0.0, 0.8)


def test_without_sampling_fields_the_defaults_stay(hf_dir, tmp_path):
    cfg, _ = import_hf(hf_dir, tmp_path / "run")  # sheepop's export: BOS and EOS only
    assert cfg.sample == SampleConfig()
    assert checkpoint.load_config(tmp_path / "run")["source"]["generation_config"] == \
        {"read": {}, "notes": []}


def test_do_sample_false_is_greedy(hf_dir, tmp_path):
    d = with_generation_config(hf_dir, tmp_path, {"do_sample": False, "temperature": 0.6})
    cfg, _ = import_hf(d, tmp_path / "run")
    assert cfg.sample.temperature == 0.0


def test_what_sheepop_does_not_do_is_named(hf_dir, tmp_path, capsys):
    d = with_generation_config(hf_dir, tmp_path, {
        "num_beams": 4, "typical_p": 0.9, "no_repeat_ngram_size": 3, "max_length": 50,
        "num_return_sequences": 1, "no_repeat_ngram_size_unused": None, "typical_p_default": 1.0,
        "epsilon_cutoff": 0.0})  # (the last three ask for nothing or are unknown and null)
    assert main(["import", str(d), str(tmp_path / "run")]) == 0
    err = capsys.readouterr().err
    notes = [line for line in err.splitlines() if line.startswith("sheepop: note: ")]
    named = [line.split(": ")[3].split(" = ")[0] for line in notes]
    assert named == ["num_beams", "typical_p", "no_repeat_ngram_size", "max_length",
                     "typical_p_default"]


@pytest.mark.parametrize("fields, message", [
    ({"temperature": "hot"}, "sample.temperature expects float, got 'hot'"),
    ({"top_p": 0}, "sample.top_p must be in (0, 1]"),
    ({"min_p": 2}, "sample.min_p must be in [0, 1]"),
    ({"do_sample": "yes"}, "do_sample must be true or false, not 'yes'"),
    ({"eos_token_id": "end"}, "eos_token_id must be a token id or a list of them"),
])
def test_a_bad_value_is_refused_in_one_line(hf_dir, tmp_path, capsys, fields, message):
    d = with_generation_config(hf_dir, tmp_path, fields)
    with pytest.raises(UserError, match="generation_config.json"):
        import_hf(d, tmp_path / "run")
    fails(capsys, ["import", str(d), str(tmp_path / "run")], message)
    assert not (tmp_path / "run" / "config.json").exists()
