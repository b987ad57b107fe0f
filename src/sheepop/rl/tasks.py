"""The prompts of `sheepop rl`: a JSON Lines file, or a built-in task; each a record

    {"prompt": "What is 3 + 4?", "answer": 7}         (or "messages": [...] ending with a user
                                                       turn, in place of "prompt")

that the verifier reads (sheepop.rl.verifiers), and the prompt's token ids. A model that can
chat (its tokenizer has sheepop's chat tokens or its own template) gets the prompt through its
chat template with the generation prompt after it, as `sheepop chat` asks; any other model (the
progression model: the digits tokenizer) continues the prompt's text as it is.

Built-in tasks:

    addition      "What is A + B?" -> A + B, every operand of rl.digits digits (1: 0-9, the
                  issue's 100 single-digit sums; 2: 10-99)
    progression   an arithmetic progression's terms, each D digits and a space ("0012 0019
                  0026 ") -> the next rl.answer_terms terms, for a model trained by
                  `sheepop progression train` (D, its window and its digit order from the
                  run's progression.json: "2100 9100 6200 " for a reverse_digits run)

The held-out prompts (pass@1) are `split`'s: a set with room for them keeps them apart from the
training prompts; a small one (the 100 single-digit sums) cannot, and its held-out prompts are
drawn from the same set (said in the run's log).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sheepop.errors import UserError
from sheepop.files import open_regular
from sheepop.tokenizers import Tokenizer
from sheepop.tokenizers.chat_format import can_chat, chat_ids

Record = dict[str, Any]
MAX_FILE_BYTES = 2**30
# Progression prompts drawn for a run: enough that a run of hundreds of steps rarely repeats one.
PROGRESSION_ITEMS = 20_000


def read_prompts(path: str | Path) -> list[Record]:
    """The records of a JSON Lines prompts file; a line that is not one is a UserError naming
    it (a reward needs every prompt understood: none is skipped in silence)."""
    records = []
    with open_regular(path, what="prompts file", limit=MAX_FILE_BYTES) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError):
                raise UserError(f"{path}, line {number}: not valid JSON") from None
            if not isinstance(obj, dict) or not (isinstance(obj.get("prompt"), str)
                                                 or isinstance(obj.get("messages"), list)):
                raise UserError(f"{path}, line {number}: a prompt record is a JSON object with "
                                "'prompt' (text) or 'messages' (a conversation)")
            records.append(obj)
    if not records:
        raise UserError(f"{path}: no prompts")
    return records


def addition_items(digits: int) -> list[Record]:
    """Every sum of two `digits`-digit operands (at most 10,000, drawn evenly beyond)."""
    low, high = (0 if digits == 1 else 10 ** (digits - 1)), 10 ** digits
    span = high - low
    if span * span <= 10_000:
        pairs = [(a, b) for a in range(low, high) for b in range(low, high)]
    else:
        rng = np.random.default_rng(0)
        pairs = [tuple(int(v) for v in p) for p in rng.integers(low, high, (10_000, 2))]
    return [{"prompt": f"What is {a} + {b}?", "answer": a + b} for a, b in pairs]


def progression_items(digits: int, context_terms: int, answer_terms: int, seed: int = 0,
                      reverse: bool = False) -> list[Record]:
    """Progressions of `digits`-digit terms: `context_terms` given (each followed by a space),
    the next `answer_terms` to write; first term and difference drawn so every term fits.
    `reverse`: each term's digits least significant first, as a run trained with
    reverse_digits reads and writes them (the record says so to the verifier)."""
    if context_terms < 2:
        raise UserError(f"the progression task needs 2 given terms in the model's window: "
                        f"rl.answer_terms={answer_terms} leaves {context_terms}")
    rng = np.random.default_rng(seed)
    n = context_terms + answer_terms
    top = 10 ** digits - 1
    items = []
    for _ in range(PROGRESSION_ITEMS):
        d = int(rng.integers(1, max(2, top // (2 * n))))
        first = int(rng.integers(0, top - d * (n - 1) + 1))
        terms = [first + d * k for k in range(n)]
        text = "".join(_term(t, digits, reverse) + " " for t in terms[:context_terms])
        items.append({"prompt": text, "answer": terms[context_terms:],
                      "reverse_digits": reverse})
    return items


def _term(value: int, digits: int, reverse: bool) -> str:
    text = f"{value:0{digits}d}"
    return text[::-1] if reverse else text


def prompt_ids(tokenizer: Tokenizer, record: Record) -> list[int]:
    """The ids the model answers after: the chat template's with the generation prompt when the
    model can chat, else the prompt's own text."""
    if can_chat(tokenizer):
        messages = record.get("messages") or [{"role": "user", "content": record["prompt"]}]
        return chat_ids(tokenizer, messages, add_generation_prompt=True)[0]
    if "prompt" not in record:
        raise UserError("a prompt given as 'messages' needs a model that can chat (its "
                        "tokenizer has no chat template): give 'prompt' text")
    return tokenizer.encode(record["prompt"])


def split(items: Sequence[Record], held_out: int, seed: int) -> tuple[list[Record],
                                                                       list[Record], bool]:
    """(training prompts, held-out prompts, whether they are apart): the first `held_out` of a
    seeded permutation are held out when at least as many remain to train on; otherwise every
    prompt trains and the held-out ones are drawn from them."""
    order = np.random.default_rng(seed).permutation(len(items))
    if held_out == 0:
        return [items[i] for i in order], [], True
    if len(items) >= 2 * held_out:
        return ([items[i] for i in order[held_out:]], [items[i] for i in order[:held_out]],
                True)
    draws = np.random.default_rng(seed + 1).integers(0, len(items), held_out)
    return [items[i] for i in order], [items[i] for i in draws], False
