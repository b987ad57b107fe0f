"""`sheepop chat` on the run `sheepop rl --lora-rank` leaves (issue 43: the RL-tuned model is
talked to like any fine-tune): the run holds adapters only, and chat reads them back onto the
base run, merged, so its answers are the tuned model's greedy ones, not the base's."""

from __future__ import annotations

import io
import json
import sys

import numpy as np
import pytest

from sheepop.checkpoint import format as checkpoint
from sheepop.cli import main
from sheepop.cli.chat import escape
from sheepop.config.schema import Config, ModelConfig, SampleConfig
from sheepop.generation.text_stream import stream_text
from sheepop.inference.load import load
from sheepop.scratch.init import param_shapes
from sheepop.tokenizers import IncrementalDecoder, train_tokenizer
from sheepop.tokenizers.chat_format import render_chat, with_chat_tokens

pytestmark = pytest.mark.usefixtures("one_torch_thread")
MAX_NEW = 6
GREEDY = ["--temperature", "0", "--max-new-tokens", str(MAX_NEW)]
QUESTIONS = ["ab", "ba", "c"]


@pytest.fixture(scope="module")
def chat_base(tmp_path_factory):
    """A 1-layer model whose tokenizer has sheepop's chat tokens, random weights (O(0.5))."""
    tok, _ = with_chat_tokens(train_tokenizer("char", ["abc \n"]))
    cfg = Config()
    cfg.model = ModelConfig(vocab_size=tok.vocab_size, block_size=64, n_layer=1, n_head=2,
                            n_embd=32, tie_weights=False)
    rng = np.random.default_rng(3)
    w = {k: (rng.normal(size=s) * (0.5 if len(s) > 1 else 0.2)
             + (1.0 if k.endswith("weight") and len(s) == 1 else 0.0)).astype(np.float32)
         for k, s in param_shapes(cfg.model).items()}
    root = tmp_path_factory.mktemp("rl-chat")
    checkpoint.save_checkpoint(root / "base", w, cfg.to_dict(), tok.to_json())
    return root


def greedy(model, question: str) -> str:
    """The model's greedy answer to one user message, as chat renders it (stops at <|end|>)."""
    tok = model.tokenizer
    ids = tok.encode(render_chat([{"role": "user", "content": question}],
                                 add_generation_prompt=True))
    stops = [t for t in tok.special_tokens if t != "<|end|>"]
    return "".join(stream_text(model.lm, ids, SampleConfig(temperature=0,
                                                           max_new_tokens=MAX_NEW),
                               IncrementalDecoder(tok), stop=stops,
                               eos_id=tok.special_tokens["<|end|>"]))


def test_chat_talks_to_the_lora_tuned_model(chat_base, monkeypatch, capsys):
    root = chat_base
    # reward: answers made of the letter c only; a high LoRA rate so a few steps move the model
    (root / "prompts.jsonl").write_text("".join(
        json.dumps({"prompt": q, "answer": "c+"}) + "\n" for q in QUESTIONS))
    assert main(["rl", str(root / "base"), "--prompts", str(root / "prompts.jsonl"),
                 "--verifier", "regex", "--lora-rank", "4", "--out", str(root / "rl"),
                 "--steps", "8", "--threads", "1", "--set", "train.lr=0.2",
                 "--set", "train.min_lr=0.2", "--set", f"rl.max_new_tokens={MAX_NEW}",
                 "--set", "rl.eval_prompts=0", "--set", "rl.group_size=8",
                 "--set", "train.batch_size=3", "--set", "lora.targets=qkv,proj,fc"]) == 0
    out = capsys.readouterr().out
    assert f"talk to it with: sheepop chat {root / 'rl'}" in out
    # the run holds the adapters only (no copy of the base), and lora.json names the base
    saved = checkpoint.load_weights(root / "rl")
    assert saved and all(".lora_" in name for name in saved), sorted(saved)
    assert json.loads((root / "rl" / "lora.json").read_text())["base_run"] == str(
        (root / "base").resolve())
    tuned, base = load(root / "rl", "torch"), load(root / "base", "torch")
    expected = [greedy(tuned, q) for q in QUESTIONS]
    # RL moved the answers: a chat that read the base alone would write other ones
    assert expected != [greedy(base, q) for q in QUESTIONS], expected
    assert sum(a.count("c") for a in expected) > sum(greedy(base, q).count("c")
                                                     for q in QUESTIONS)
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(QUESTIONS) + "\n"))
    assert main(["chat", str(root / "rl"), *GREEDY, "--engine", "numpy"]) == 0
    out, err = capsys.readouterr()
    assert out == "".join(escape(a) + "\n" for a in expected), (out, expected)
    assert err.splitlines()[0].startswith(f"sheepop: chat with {root / 'rl'} (")
