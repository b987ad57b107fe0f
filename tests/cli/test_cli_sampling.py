"""Sampling from the command line (issue 41): each call draws a fresh seed and says it, so the
same text comes back with --seed; --min-p is a setting like --top-p; a temperature whose
division overflows (5e-324) is greedy in generate and chat; a version-2 run's [sample] that
holds version 2's defaults takes today's."""

from __future__ import annotations

import io
import json
import re
import sys

import numpy as np
import pytest
from cli_refusal import fails

from sheepop.checkpoint import format as checkpoint
from sheepop.cli import main
from sheepop.cli.common import run_config
from sheepop.config.schema import Config, ModelConfig, SampleConfig
from sheepop.scratch.init import param_shapes
from sheepop.tokenizers import train_tokenizer
from sheepop.tokenizers.chat_format import with_chat_tokens

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: see tests/conftest.py
SEED_LINE = re.compile(r"^sheepop: seed (\d+) \(the same text again: --seed \1\)$", re.M)
# Hot and long enough that two seeds give two texts; numpy: no torch to import.
HOT = ["--temperature", "1.5", "--max-new-tokens", "24", "--engine", "numpy"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny model whose tokenizer has the chat tokens, random weights O(0.5)."""
    tok, _ = with_chat_tokens(train_tokenizer("char", ["abcdefgh ijk.\n"]))
    cfg = Config()
    cfg.model = ModelConfig(vocab_size=tok.vocab_size, block_size=64, n_layer=1, n_head=2,
                            n_embd=32, tie_weights=False)
    rng = np.random.default_rng(5)
    w = {k: (rng.normal(size=s) * (0.5 if len(s) > 1 else 0.2)
             + (1.0 if k.endswith("weight") and len(s) == 1 else 0.0)).astype(np.float32)
         for k, s in param_shapes(cfg.model).items()}
    path = tmp_path_factory.mktemp("sampling") / "run"
    checkpoint.save_checkpoint(path, w, cfg.to_dict(), tok.to_json())
    return path


def generated(capsys, *argv: str) -> tuple[str, str]:
    assert main(["generate", *argv]) == 0
    out, err = capsys.readouterr()
    return out, err


def chatted(capsys, monkeypatch, run, lines: str, *argv: str) -> tuple[str, str]:
    monkeypatch.setattr(sys, "stdin", io.StringIO(lines))
    assert main(["chat", str(run), "--engine", "numpy", *argv]) == 0
    return capsys.readouterr()


def test_generate_draws_a_fresh_seed_each_time_and_says_it(run, capsys):
    first, err1 = generated(capsys, str(run), "--prompt", "ab", *HOT)
    second, err2 = generated(capsys, str(run), "--prompt", "ab", *HOT)
    seeds = [int(SEED_LINE.search(err).group(1)) for err in (err1, err2)]
    assert seeds[0] != seeds[1]  # (two draws of 32 bits: equal once in 4e9)
    for seed, text in zip(seeds, (first, second)):
        again, err = generated(capsys, str(run), "--prompt", "ab", *HOT, "--seed", str(seed))
        assert again == text and not SEED_LINE.search(err)  # a seed given is not repeated
    greedy = generated(capsys, str(run), "--prompt", "ab", "--temperature", "0",
                       "--engine", "numpy")
    assert not SEED_LINE.search(greedy[1])  # greedy decoding draws nothing


def test_chat_draws_a_fresh_seed_and_says_it(run, capsys, monkeypatch):
    turns = "abc\nhi\n"
    out, err = chatted(capsys, monkeypatch, run, turns, *HOT)
    seed = SEED_LINE.search(err).group(1)
    again, err = chatted(capsys, monkeypatch, run, turns, *HOT, "--seed", seed)
    assert again == out and len(out.splitlines()) == 2


@pytest.mark.parametrize("tiny", ["5e-324", "1e-308"])
def test_a_temperature_whose_division_overflows_is_greedy(run, capsys, monkeypatch, tiny):
    """z / tau overflowed to NaN: generate printed BOS after BOS with exit status 0."""
    argv = [str(run), "--prompt", "ab", "--max-new-tokens", "20", "--engine", "numpy"]
    greedy, _ = generated(capsys, *argv, "--temperature", "0")
    assert generated(capsys, *argv, "--temperature", tiny)[0] == greedy
    chat_greedy, _ = chatted(capsys, monkeypatch, run, "abc\n", "--temperature", "0",
                             "--max-new-tokens", "20")
    chat_tiny, _ = chatted(capsys, monkeypatch, run, "abc\n", "--temperature", tiny,
                           "--max-new-tokens", "20")
    assert chat_tiny == chat_greedy


def test_min_p_is_a_sampling_flag(run, capsys):
    argv = [str(run), "--prompt", "ab", "--max-new-tokens", "20", "--engine", "numpy"]
    greedy, _ = generated(capsys, *argv, "--temperature", "0")
    # min-p 1 keeps the most likely token only: any temperature, any seed, greedy's text
    for seed in ("1", "2"):
        assert generated(capsys, *argv, "--temperature", "1.5", "--min-p", "1",
                         "--seed", seed)[0] == greedy
    fails(capsys, ["generate", *argv, "--min-p", "1.5"], "sample.min_p must be in [0, 1]")
    fails(capsys, ["generate", *argv, "--seed", "-2"], "sample.seed must be in [0, 2^63), or -1")
    cfg = run_config(run, [], None, {"sample.min_p": 0.2})
    assert (cfg.sample.min_p, cfg.sample.top_p, cfg.sample.top_k) == (0.2, 0.95, 40)


def test_a_version_2_runs_sample_defaults_become_todays(run, tmp_path):
    saved = checkpoint.load_config(run)
    v2 = {**saved, "config_version": 2,
          "sample": {"max_new_tokens": 200, "temperature": 0.8, "top_k": 0, "top_p": 1.0,
                     "seed": 1337, "repetition_penalty": 1.0, "slide_chunk": 0}}
    assert Config.from_saved(json.loads(json.dumps(v2)), "config.json").sample == SampleConfig()
    v2["sample"].update(top_k=7, seed=3, temperature=0.5)  # set by a user: kept
    sample = Config.from_saved(v2, "config.json").sample
    assert (sample.top_k, sample.seed, sample.temperature, sample.top_p, sample.min_p) == \
        (7, 3, 0.5, 0.95, 0.05)
