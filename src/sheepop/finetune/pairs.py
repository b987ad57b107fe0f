"""Preference pairs for DPO: JSON Lines in, a chosen and a rejected example per line out.

One pair a line, the prompt in either of the conversation forms fine-tuning reads
(sheepop.data.conversations) and the two answers as strings:

    {"prompt": "...", "chosen": "...", "rejected": "..."}
    {"messages": [{"role": ..., "content": ...}, ...], "chosen": "...", "rejected": "..."}

(an answer may also be given as [{"role": "assistant", "content": "..."}], TRL's
conversational form). Each answer becomes the assistant's turn after the prompt and the pair two
examples (x, y) through the chat template, so the template's loss mask decides which tokens
count: the assistant's (or, with finetune.train_on=all, every one; the prompt's tokens are the
same in both answers, so their log-probabilities cancel in DPO's margin). Unlike conversations
for supervised fine-tuning, a bad line is not skipped: a pair is a judgement someone made, and
one that cannot be read is refused with its line number (one `sheepop:` line, exit status 2).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sheepop.arch import IGNORE_INDEX
from sheepop.data.conversations import MAX_FILE_BYTES, Example
from sheepop.errors import UserError
from sheepop.files import open_regular
from sheepop.tokenizers import Tokenizer
from sheepop.tokenizers.chat_format import encode_chat, message_problem, require_chat_tokens

Pair = tuple[Example, Example]  # (chosen, rejected)


def prompt_of(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """The conversation before the answers: `messages`, or `prompt` as one user turn."""
    if ("messages" in obj) == ("prompt" in obj):
        raise ValueError("give either 'messages' or 'prompt' (one of them)")
    if "prompt" in obj:
        if not isinstance(obj["prompt"], str) or not obj["prompt"]:
            raise ValueError("'prompt' is not a non-empty string")
        return [{"role": "user", "content": obj["prompt"]}]
    messages = obj["messages"]
    problem = message_problem(messages)
    if problem:
        raise ValueError(f"'messages': {problem}")
    return messages


def answer_of(obj: dict[str, Any], key: str) -> str:
    """The answer under `key`: a non-empty string (or one assistant message holding one)."""
    if key not in obj:
        raise ValueError(f"'{key}' missing")
    value = obj[key]
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], dict) \
            and value[0].get("role") == "assistant":
        value = value[0].get("content")
    if not isinstance(value, str):
        raise ValueError(f"'{key}' is not a string (nor one assistant message)")
    if not value.strip():
        raise ValueError(f"'{key}' is empty")
    return value


def pair_of(line: bytes, tokenizer: Tokenizer, block_size: int, train_on: str) -> Pair:
    """The (chosen, rejected) examples of one line; ValueError saying why there are none."""
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        raise ValueError("not valid JSON") from None
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    prompt = prompt_of(obj)
    chosen, rejected = answer_of(obj, "chosen"), answer_of(obj, "rejected")
    if chosen == rejected:
        raise ValueError("'chosen' and 'rejected' are the same answer")
    examples = []
    for answer in (chosen, rejected):
        try:
            x, y = encode_chat(tokenizer, [*prompt, {"role": "assistant", "content": answer}],
                               train_on=train_on)
        except UserError as e:  # a special token's name inside a message
            raise ValueError(str(e)) from None
        if len(x) > block_size:
            raise ValueError(f"does not fit the context of {block_size} tokens")
        if not (y != IGNORE_INDEX).any():
            raise ValueError("an answer with no token to score")
        examples.append((x, y))
    return examples[0], examples[1]


def read_pairs(path: str | Path, tokenizer: Tokenizer, block_size: int,
               train_on: str = "assistant") -> list[Pair]:
    """Every pair of the JSON Lines file at `path` (blank lines skipped); a UserError naming the
    first line that is not a pair, or an empty file."""
    require_chat_tokens(tokenizer, "the tokenizer")
    pairs: list[Pair] = []
    with open_regular(path, what="preference pairs file", limit=MAX_FILE_BYTES) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                pairs.append(pair_of(line, tokenizer, block_size, train_on))
            except ValueError as e:
                raise UserError(f"{path}, line {number}: {e} (a DPO pair is {{\"prompt\" or "
                                f"\"messages\", \"chosen\", \"rejected\"}})") from None
    if len(pairs) < 2:
        raise UserError(f"{path}: {len(pairs)} preference pair{'s' if len(pairs) != 1 else ''}"
                        ": DPO needs at least 2 (one is held out to measure it)")
    return pairs
