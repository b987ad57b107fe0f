"""The tokens/s a fine-tune reports counts the tokens its padded batches hold, not block_size per
row: a batch of conversations is as long as its longest one (a real model's 8,192-token context
against ~40-token conversations overstated the rate 200 times)."""

from __future__ import annotations

import json

import pytest

from sheepop.data.conversations import read_conversations
from sheepop.finetune.run import base_model, finetune, split_examples
from sheepop.finetune.sampler import ChatSampler

CHATS = [{"prompt": f"after {n}?" + "?" * (n % 5), "completion": f"{n + 1}"} for n in range(24)]


@pytest.mark.usefixtures("one_torch_thread")
def test_tokens_per_second_counts_the_padded_batches(tmp_path, tiny_config, tiny_trainer,
                                                     read_metrics):
    cfg = tiny_config("torch", dropout=0.0)
    cfg.set("model.block_size", 64)
    tiny_trainer(cfg, tmp_path / "base").run()
    data = tmp_path / "chats.jsonl"
    data.write_text("".join(json.dumps(c) + "\n" for c in CHATS))
    steps, batch, seed = 5, 3, 7
    summary = finetune(str(tmp_path / "base"), str(data), tmp_path / "ft",
                       overrides=[f"train.batch_size={batch}", "train.eval_interval=0",
                                  "train.warmup_steps=1", f"train.seed={seed}"],
                       values={"train.steps": steps}, log=lambda *_: None, progress=False)

    # The same batches, drawn again: the sampler is seeded by train.seed.
    _, tokenizer, _, _ = base_model(tmp_path / "base")
    chats = read_conversations(data, tokenizer, 64)
    train, _ = split_examples(chats.examples, cfg.data.val_fraction, seed)
    sampler = ChatSampler(train, batch, seed, tokenizer.pad_id or 0)
    held = sum(sampler.next_batch()[0].size for _ in range(steps))
    assert held < steps * batch * 64  # (shorter than the context, or the test shows nothing)
    assert summary.tokens_per_sec * summary.seconds == pytest.approx(held, rel=1e-9)
    last = read_metrics(tmp_path / "ft")[-1]
    assert last["step"] == steps and last["tokens_per_sec"] > 0
