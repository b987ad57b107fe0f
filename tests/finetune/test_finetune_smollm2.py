"""LoRA on a real model: SmolLM2-135M-Instruct (30 layers, 49,152-token vocabulary, tied
embeddings, grouped-query attention), imported from its GGUF file, fine-tuned for a few steps on
a handful of conversations through its own ChatML template. Only the adapters change (the base
run's weights file is untouched, no token is added), the loss on the training conversations
falls, and the fine-tuned run loads through its base and answers through the template, its
reply ending at <|im_end|>."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from sheepop.arch.lora import LoraConfig
from sheepop.checkpoint import format as checkpoint
from sheepop.config.schema import SampleConfig
from sheepop.data.conversations import pad_examples, read_conversations
from sheepop.finetune.demo import answers
from sheepop.finetune.run import finetune
from sheepop.finetune.tasks import Item
from sheepop.generation.generate import generate_batch_ids
from sheepop.inference.load import load
from sheepop.tokenizers.chat_format import chat_ids, turn_end

pytestmark = pytest.mark.real_model

SYSTEM = "Answer with the result only."
ITEMS = [Item("after", f"What comes after {n}?", str(n + 1)) for n in (17, 230, 58, 904, 3)]


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_lora_on_smollm2_trains_only_the_adapters_and_answers_through_its_template(
        smollm2_run, tmp_path):
    data = tmp_path / "chats.jsonl"
    data.write_text("".join(it.json_line(SYSTEM) + "\n" for it in ITEMS))
    weights_file = smollm2_run / "model.safetensors"
    before_digest = digest(weights_file)
    base = load(smollm2_run, "torch")
    tok = base.tokenizer
    examples = read_conversations(data, tok, 256).examples
    x, y = pad_examples(examples, pad_id=0)
    loss_before, counted = base.loss_sum(x, y)
    del base

    lines: list[str] = []
    summary = finetune(str(smollm2_run), str(data), tmp_path / "lora",
                       overrides=["lora.rank=8", "lora.alpha=16", "lora.targets=qkv,proj",
                                  "train.batch_size=4", "train.lr=5e-3", "train.warmup_steps=1",
                                  "train.min_lr=5e-3", "train.eval_interval=0",
                                  "train.checkpoint_interval=0", "train.eval_batches=1"],
                       values={"train.steps": 6}, log=lines.append, progress=False)
    assert summary.steps == 6
    assert any(line.endswith("conversations through the model's own chat template "
                             "(49152 ids)") for line in lines), lines
    # 30 layers x (qkv: 8 x (576 + 960), proj: 8 x (576 + 576)) = 645,120
    assert any("model: 134,515,008 parameters" in line for line in lines), lines  # as chat's
    assert any("645,120 adapter parameters (0.48% of the model's), 645,120 trained" in line
               for line in lines), lines

    # Only the adapters were trained and saved; the base run is as it was.
    assert digest(weights_file) == before_digest
    saved = checkpoint.load_weights(tmp_path / "lora")
    assert len(saved) == 2 * 2 * 30
    assert all(name.endswith((".lora_A", ".lora_B")) for name in saved)
    assert LoraConfig.load(tmp_path / "lora").new_tokens == 0
    assert any(np.abs(w).max() > 0 for name, w in saved.items() if name.endswith(".lora_B"))

    tuned = load(tmp_path / "lora", "torch")
    assert tuned.tokenizer.to_json() == tok.to_json()
    loss_after, counted_after = tuned.loss_sum(x, y)
    assert counted_after == counted
    assert loss_after / counted < 0.5 * loss_before / counted, (loss_before, loss_after)

    # The reply is greedy through the template and ends at <|im_end|> (never part of the text).
    end = turn_end(tuned.tokenizer)
    im_end = tok.special_tokens["<|im_end|>"]
    assert end.eos_id == im_end
    prompt = chat_ids(tok, ITEMS[0].messages(SYSTEM)[:-1], True)[0]
    ids = generate_batch_ids(tuned.lm, [prompt], SampleConfig(max_new_tokens=16,
                                                              temperature=0.0), eos_id=im_end)[0]
    assert ids[-1] == im_end and im_end not in ids[:-1], tok.decode(ids)
    reply = answers(tuned, ITEMS[:1], max_new_tokens=16, system=SYSTEM)
    assert reply == [tok.decode(ids[:-1])]
