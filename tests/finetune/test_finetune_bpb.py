"""Why a fine-tune's val bpb is above its val_loss / ln 2 (issue 30: 3.107 against 2.318).

Bits per byte divides the scored targets' nats by the UTF-8 bytes those targets stand for
(sheepop.tokenizers.token_bytes). A fine-tune scores each answer's tokens and the <|end|> that
closes it; <|end|> is no text (0 bytes) but its nats count. So bpb = (loss / ln 2) * N / bytes,
N / bytes = (answer tokens + answers) / answer bytes: 197 / 147 = 1.3401 on the demo task's
answers ("141"), the ratio 3.107 / 2.318 = 1.3404 of the report. The rule is right (the end
of an answer is something the model must predict, as the EOS between documents is in
pre-training); these tests pin what it counts."""

import json
import math

import numpy as np

from sheepop.arch import IGNORE_INDEX
from sheepop.data.conversations import read_conversations
from sheepop.finetune.sampler import fixed_batches
from sheepop.finetune.tasks import write_demo_data
from sheepop.tokenizers import train_tokenizer
from sheepop.tokenizers.chat_format import with_chat_tokens
from sheepop.tokenizers.token_bytes import TargetBytes, bits_per_byte


def test_a_finetunes_bits_per_byte_counts_the_answers_bytes_and_the_end_tokens_nats(tmp_path):
    files = write_demo_data(tmp_path, 50, 50)
    lines = [json.loads(line) for line in files["heldout"].read_text().splitlines()]
    text = "".join(m["content"] for c in lines for m in c["messages"])
    tokenizer, _ = with_chat_tokens(train_tokenizer("char", [text]))
    chats = read_conversations(files["heldout"], tokenizer, 256)
    x, y = fixed_batches(chats.examples, len(lines), tokenizer.pad_id)
    answers = [m["content"] for c in lines for m in c["messages"] if m["role"] == "assistant"]
    scored = y[y != IGNORE_INDEX]
    end = tokenizer.special_tokens["<|end|>"]
    # The scored targets: every answer's characters, then its <|end|>; nothing else.
    assert len(scored) == sum(len(a) for a in answers) + len(answers)
    assert np.count_nonzero(scored == end) == len(answers)
    n_bytes = TargetBytes(tokenizer).count(x, y)
    assert n_bytes == sum(len(a.encode()) for a in answers)  # <|end|>: 0 bytes
    # So for any loss: bpb = (loss / ln 2) * N / bytes; the demo's answers are a few characters
    # ("141", "yes"), one <|end|> each: N / bytes near 4 / 3.
    loss = 2.318 * math.log(2)  # nats per target: 2.318 bits per token
    bpb = bits_per_byte(loss * len(scored), n_bytes)
    assert math.isclose(bpb, 2.318 * len(scored) / n_bytes, rel_tol=1e-12)
    assert 1.2 < len(scored) / n_bytes < 1.5
