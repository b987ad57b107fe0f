"""`sheepop chat` keeps its conversation's KV cache between turns (CachedLM.prefill keeps the
tokens its cache holds that begin the next prompt), and its answers stay those of a fresh
model, in both engines."""

from __future__ import annotations

import io

import numpy as np
import pytest

from sheepop.checkpoint import format as checkpoint
from sheepop.cli.chat import Chat
from sheepop.config.schema import Config, ModelConfig, SampleConfig
from sheepop.generation.text_stream import stream_text
from sheepop.inference.load import load
from sheepop.scratch.init import param_shapes
from sheepop.tokenizers import IncrementalDecoder, train_tokenizer
from sheepop.tokenizers.chat_format import render_chat, with_chat_tokens

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: see tests/conftest.py
MAX_NEW = 8


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tok, _ = with_chat_tokens(train_tokenizer("char", ["abc \n"]))
    cfg = Config()
    cfg.model = ModelConfig(vocab_size=tok.vocab_size, block_size=128, n_layer=1, n_head=2,
                            n_embd=32, tie_weights=False)
    rng = np.random.default_rng(3)
    w = {k: (rng.normal(size=s) * (0.5 if len(s) > 1 else 0.2)
             + (1.0 if k.endswith("weight") and len(s) == 1 else 0.0)).astype(np.float32)
         for k, s in param_shapes(cfg.model).items()}
    path = tmp_path_factory.mktemp("chat_reuse") / "chat"
    checkpoint.save_checkpoint(path, w, cfg.to_dict(), tok.to_json())
    return path


def _fresh_answer(run, engine, conversation) -> str:
    model = load(run, engine)
    tok = model.tokenizer
    ids = tok.encode(render_chat(conversation, add_generation_prompt=True))
    stops = [t for t in tok.special_tokens if t != "<|end|>"]
    return "".join(stream_text(model.lm, ids, SampleConfig(temperature=0, max_new_tokens=MAX_NEW),
                               IncrementalDecoder(tok), stop=stops,
                               eos_id=tok.special_tokens["<|end|>"]))


@pytest.mark.parametrize("engine", ["torch", "numpy"])
def test_each_turn_computes_only_what_follows_the_conversation_so_far(run, engine):
    model = load(run, engine)
    chat = Chat(model, SampleConfig(temperature=0, max_new_tokens=MAX_NEW), "a b", False,
                io.StringIO())
    tok = model.tokenizer
    said = []
    for user in ["abc", "c a", "b"]:
        before = tok.encode(render_chat(chat.conversation(), add_generation_prompt=False))
        answer = chat.answer(user, lambda piece: None)
        if said:  # the conversation so far is a prefix of this turn's prompt, and the cache
            # holds all of it but the last answer's last token (drawn, never fed), and the
            # <|end|> and line break the template writes after it
            assert model.lm.reused >= len(before) - 3 > 10
        assert answer == _fresh_answer(run, engine, chat.conversation()[:-1])
        said.append(answer)
    assert model.lm.reused > 0
