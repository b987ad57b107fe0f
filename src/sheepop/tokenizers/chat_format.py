"""Conversations as tokens: the chat template, its special tokens, and the loss mask.

A conversation is a list of messages {"role": "system" | "user" | "assistant", "content": str}
(a system message, if any, comes first). It is rendered as text, one turn after the other:

    <|{role}|>\\n{content}<|end|>\\n        for each message
    <|assistant|>\\n                        at the end, to ask for an answer (generation prompt)

and the text is encoded as any text is: the four tokens of CHAT_SPECIALS are special tokens,
each one id, never split or merged. `CHAT_TEMPLATE` is the same rule in Jinja, the language of
Hugging Face's `chat_template`: it is saved in the tokenizer's file and exported with it, so that
`transformers`' `apply_chat_template` gives exactly these ids.

Training targets (`encode_chat`): x = ids[:-1], y[t] = ids[t + 1] (as a pretraining window),
except that y[t] = IGNORE_INDEX wherever ids[t + 1] is not the assistant's to write: what counts
is the tokens of each assistant turn's content and the <|end|> that closes it, so the model
learns to answer and to stop, not to predict the user.

A model that ships its own chat template (a real model's tokenizer: `chat_template` is another
Jinja text) is rendered by that template instead, in a sandbox (sheepop.tokenizers.chat_template),
with its own loss mask and end of turn (sheepop.tokenizers.chat_shipped); every function here
takes either kind of tokenizer. sheepop's template is for the models sheepop trains: its tokens
are never added to a tokenizer that has a template of its own.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from sheepop.arch import IGNORE_INDEX
from sheepop.config.finetune import TRAIN_ON
from sheepop.errors import UserError
from sheepop.tokenizers.base import Tokenizer
from sheepop.tokenizers.chat_shipped import (
    shipped_chat_ids,
    shipped_fit_context,
    shipped_turn_end,
)

ROLES = ("system", "user", "assistant")
END = "<|end|>"
CHAT_SPECIALS = ("<|system|>", "<|user|>", "<|assistant|>", END)

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role: ' + message['role']) }}{% endif %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}")
"""The rendering rule in Jinja (Hugging Face's `chat_template`); `render_chat` in Python."""

Message = Mapping[str, Any]


def role_token(role: str) -> str:
    return f"<|{role}|>"


def message_problem(messages: Any) -> str | None:
    """Why `messages` is not a conversation this template renders, or None when it is."""
    if not isinstance(messages, list) or not messages:
        return "empty conversation" if isinstance(messages, list) else "messages not a list"
    for k, m in enumerate(messages, 1):
        if not isinstance(m, dict):
            return f"message {k} not an object"
        if m.get("role") not in ROLES:
            return f"message {k}: unknown role {_short(m.get('role'))}"
        if not isinstance(m.get("content"), str):
            return f"message {k}: {'no' if 'content' not in m else 'non-string'} content"
        if m["role"] == "system" and k > 1:
            return f"message {k}: a system message after the first message"
    return None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 30 else text[:27] + "..."


def render_chat(messages: Sequence[Message], add_generation_prompt: bool = False) -> str:
    """The conversation as text (the module docstring's rule, as CHAT_TEMPLATE renders it)."""
    text = "".join(f"{role_token(m['role'])}\n{m['content']}{END}\n" for m in messages)
    return text + (f"{role_token('assistant')}\n" if add_generation_prompt else "")


def has_chat_tokens(tokenizer: Tokenizer) -> bool:
    """Whether `tokenizer` speaks this template: the four tokens and this template's text."""
    return (all(t in tokenizer.special_tokens for t in CHAT_SPECIALS)
            and tokenizer.chat_template == CHAT_TEMPLATE)


def has_model_template(tokenizer: Tokenizer) -> bool:
    """Whether `tokenizer` ships a chat template of its own (any template but sheepop's)."""
    return tokenizer.chat_template is not None and tokenizer.chat_template != CHAT_TEMPLATE


def can_chat(tokenizer: Tokenizer) -> bool:
    """Whether `tokenizer` renders conversations: sheepop's template with its tokens, or the
    model's own template."""
    return has_chat_tokens(tokenizer) or has_model_template(tokenizer)


def require_chat_tokens(tokenizer: Tokenizer, what: str = "this tokenizer") -> None:
    if not can_chat(tokenizer):
        raise UserError(f"{what} has no chat template (with_chat_tokens adds it, as sheepop "
                        "finetune does)")


def with_chat_tokens(tokenizer: Tokenizer) -> tuple[Tokenizer, int]:
    """(a tokenizer with the chat tokens and template, how many ids were added).

    Missing tokens of CHAT_SPECIALS get new ids vocab_size, vocab_size + 1, ... in that order;
    every existing id keeps its meaning, so a model needs only new rows for the added ids. A
    tokenizer with a template of its own is returned as it is: its model was taught that one.
    """
    if has_chat_tokens(tokenizer) or has_model_template(tokenizer):
        return tokenizer, 0
    grown = tokenizer.with_special_tokens(CHAT_SPECIALS)
    if grown is tokenizer:  # the tokens were there already, the template was not
        grown = copy.copy(tokenizer)
    grown.chat_template = CHAT_TEMPLATE
    return grown, grown.vocab_size - tokenizer.vocab_size


def _encode_text(tokenizer: Tokenizer, text: str, where: str) -> list[int]:
    """Ids of a message's text, which must hold no special token: content is words, never
    control (a user typing "<|end|>" must not end a turn), and Hugging Face would read a
    special token's name in the text as that token."""
    for _, special in tokenizer.split_specials(text):
        if special is not None:
            raise UserError(f"{where} holds the special token "
                            f"{tokenizer.id_to_token(special)}, which a message cannot contain")
    return tokenizer.encode(text)


def message_ids(tokenizer: Tokenizer, message: Message, where: str = "the message"
                ) -> tuple[list[int], list[bool]]:
    """(ids of one rendered message, for each id whether it is the assistant's to write).

    In an assistant turn, the ordinary piece "\\n" + content is encoded whole; the tokens of
    "\\n" that the generation prompt also ends with are the template's, the rest the
    assistant's (all of them, in the rare case where the first token joins the line break to the
    content), and so is the <|end|> that closes the turn.
    """
    sp = tokenizer.special_tokens
    line_break = tokenizer.encode("\n")
    piece = _encode_text(tokenizer, "\n" + message["content"], where)
    mine = message["role"] == "assistant"
    template = len(line_break) if mine and piece[:len(line_break)] == line_break else 0
    ids = [sp[role_token(message["role"])], *piece, sp[END], *line_break]
    own = [False, *(mine and i >= template for i in range(len(piece))), mine]
    return ids, own + [False] * len(line_break)


def generation_prompt_ids(tokenizer: Tokenizer) -> list[int]:
    """The ids that ask for an answer: <|assistant|> and its line break."""
    return [tokenizer.special_tokens[role_token("assistant")], *tokenizer.encode("\n")]


def chat_ids(tokenizer: Tokenizer, messages: Sequence[Message],
             add_generation_prompt: bool = False) -> tuple[list[int], list[bool]]:
    """(ids of the rendered conversation, for each id whether it is the assistant's to write).

    The ids equal tokenizer.encode(render_chat(...)): the special tokens cut the text into the
    same ordinary pieces either way, so the conversation's ids are its messages' ids in a row.
    (A model's own template: sheepop.tokenizers.chat_shipped.)
    """
    problem = message_problem(list(messages))
    if problem is not None:
        raise UserError(f"not a conversation: {problem}")
    require_chat_tokens(tokenizer)
    if has_model_template(tokenizer):
        return shipped_chat_ids(tokenizer, messages, add_generation_prompt)
    ids: list[int] = []
    own: list[bool] = []
    for k, m in enumerate(messages, 1):
        more, mine = message_ids(tokenizer, m, f"message {k}")
        ids += more
        own += mine
    if add_generation_prompt:
        prompt = generation_prompt_ids(tokenizer)
        ids += prompt
        own += [False] * len(prompt)
    return ids, own


def fit_context(tokenizer: Tokenizer, messages: Sequence[Message], limit: int
                ) -> tuple[list[int], int]:
    """(the generation prompt of the most recent part of `messages` that holds in `limit`
    tokens, how many of the oldest messages it leaves out).

    Whole turns go, oldest first (a turn: a user message and what follows it up to the next
    one); the system message, first, and the last turn always stay. UserError when those alone
    take more than `limit` tokens.
    """
    chat_ids(tokenizer, messages)  # checks the conversation and the tokenizer
    if has_model_template(tokenizer):
        return shipped_fit_context(tokenizer, messages, limit)
    pieces = [message_ids(tokenizer, m)[0] for m in messages]
    head = 1 if messages[0]["role"] == "system" else 0
    cuts = [head] + [k for k in range(head + 1, len(messages)) if messages[k]["role"] == "user"]
    fixed = sum(map(len, pieces[:head])) + len(generation_prompt_ids(tokenizer))
    for cut in cuts:
        if fixed + sum(map(len, pieces[cut:])) <= limit:
            kept = pieces[:head] + pieces[cut:]
            return [i for p in kept for i in p] + generation_prompt_ids(tokenizer), cut - head
    need = fixed + sum(map(len, pieces[cuts[-1]:]))
    raise UserError(f"the {'system message and the ' if head else ''}last turn take {need} "
                    f"tokens, more than the {limit} the context leaves them")


def encode_chat(tokenizer: Tokenizer, messages: Sequence[Message],
                add_generation_prompt: bool = False, train_on: str = "assistant"
                ) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) int64 arrays of one conversation, aligned like a pretraining window:
    x = ids[:-1], y[t] = ids[t + 1] where it counts in the loss, IGNORE_INDEX elsewhere.

    train_on="assistant": only targets that are assistant content tokens or the <|end|> closing
    an assistant turn count; "all": every target counts.
    """
    if train_on not in TRAIN_ON:
        raise UserError(f"train_on must be one of {', '.join(TRAIN_ON)}, not {train_on!r}")
    ids, own = chat_ids(tokenizer, messages, add_generation_prompt)
    x = np.asarray(ids[:-1], dtype=np.int64)
    y = np.asarray(ids[1:], dtype=np.int64)
    if train_on == "assistant":
        y[~np.asarray(own[1:], dtype=bool)] = IGNORE_INDEX
    return x, y


class TurnEnd(NamedTuple):
    """How an answer ends: `ids`, the tokens that end it (never shown); `eos_id`, the first of
    them (for loops that stop at one id); `stops`, every other special token's name (a model
    that writes one is not answering any more: the text is cut there)."""
    ids: frozenset[int]
    eos_id: int
    stops: list[str]


def turn_end(tokenizer: Tokenizer) -> TurnEnd:
    """The end of an answer: sheepop's <|end|>, or with a model's own template the token that
    template closes an answer with and the tokenizer's end-of-sequence token (SmolLM2:
    <|im_end|>, both)."""
    require_chat_tokens(tokenizer)
    ends = (shipped_turn_end(tokenizer) if has_model_template(tokenizer)
            else [tokenizer.special_tokens[END]])
    stops = [t for t, i in tokenizer.special_tokens.items() if i != ends[0]]
    return TurnEnd(frozenset(ends), ends[0], stops)
