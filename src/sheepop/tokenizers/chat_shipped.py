"""Conversations through the chat template a model ships with (sheepop.tokenizers.chat_template).

Ids: the conversation rendered as text, then encoded as any text is, with the tokenizer's
special tokens matched whole and no BOS added (a template that wants one writes `bos_token`):
the ids of `transformers`' apply_chat_template(messages, add_generation_prompt, tokenize=True).
A message's content may hold no special token (a user typing "<|im_end|>" must not end a turn).

Which ids are the assistant's to write (the fine-tuning loss mask):
- a template with {% generation %} blocks: the ids whose text overlaps a block's output (as
  `transformers`' return_assistant_tokens_mask);
- any other template, by rendering prefix by prefix: for assistant message k,
  P_k = render(messages[:k], add_generation_prompt=True) and F_k = render(messages[:k + 1]);
  the text F_k adds after P_k (the answer and what closes it, e.g. "Paris.<|im_end|>\\n") is the
  assistant's. The rule needs P_k to begin F_k and F_k to begin the whole conversation's
  text; a template that renders a turn differently once more follows is refused by name.

The end of a turn: the first special token the template writes after an assistant's answer
(ChatML: <|im_end|>), and the tokenizer's end-of-sequence token.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sheepop.errors import UserError
from sheepop.tokenizers.base import Tokenizer
from sheepop.tokenizers.chat_template import has_generation_blocks, render

Message = Mapping[str, Any]
PROBE = "sheepop"  # an answer's text, to find what the template writes after one


def template_tokens(tokenizer: Tokenizer) -> dict[str, str]:
    """The tokenizer's named special tokens as a template reads them (bos_token, ...)."""
    ids = {"bos_token": tokenizer.bos_id, "eos_token": tokenizer.eos_id,
           "unk_token": tokenizer.unk_id, "pad_token": tokenizer.pad_id}
    return {name: tokenizer.id_to_token(i) for name, i in ids.items() if i is not None}


def render_messages(tokenizer: Tokenizer, messages: Sequence[Message],
                    add_generation_prompt: bool = False):
    """The tokenizer's template on `messages` (sheepop.tokenizers.chat_template.Rendered)."""
    assert tokenizer.chat_template is not None
    return render(tokenizer.chat_template, messages, add_generation_prompt,
                  template_tokens(tokenizer))


def check_contents(tokenizer: Tokenizer, messages: Sequence[Message]) -> None:
    """UserError when a message's content holds a special token's name."""
    for k, m in enumerate(messages, 1):
        for _, special in tokenizer.split_specials(m["content"]):
            if special is not None:
                raise UserError(f"message {k} holds the special token "
                                f"{tokenizer.id_to_token(special)}, which a message cannot "
                                f"contain")


def shipped_chat_ids(tokenizer: Tokenizer, messages: Sequence[Message],
                     add_generation_prompt: bool = False) -> tuple[list[int], list[bool]]:
    """(ids of the rendered conversation, for each id whether it is the assistant's to write);
    the module docstring gives both rules."""
    check_contents(tokenizer, messages)
    whole = render_messages(tokenizer, messages, add_generation_prompt)
    if has_generation_blocks(tokenizer.chat_template):  # type: ignore[arg-type]
        spans = whole.spans
    else:
        spans = _prefix_spans(tokenizer, messages, whole.text)
    if not spans:
        ids = tokenizer.encode(whole.text)
        return ids, [False] * len(ids)
    ids, offsets = _ids_and_byte_offsets(tokenizer, whole.text)
    text = whole.text
    byte_spans = [(len(text[:a].encode("utf-8")), len(text[:b].encode("utf-8")))
                  for a, b in spans if b > a]
    own = [any(end > a and start < b for a, b in byte_spans) for start, end in offsets]
    return ids, own


def _prefix_spans(tokenizer: Tokenizer, messages: Sequence[Message], text: str
                  ) -> list[tuple[int, int]]:
    """Character ranges of `text` (the whole conversation) that the assistant writes, found
    prefix by prefix (the module docstring's rule)."""
    spans = []
    for k, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        asked = render_messages(tokenizer, messages[:k], True).text
        answered = render_messages(tokenizer, messages[:k + 1]).text
        if not answered.startswith(asked) or not text.startswith(answered):
            raise UserError(
                f"this chat template renders message {k + 1} (an assistant's) differently "
                "once the conversation goes on, so the assistant's tokens cannot be found by "
                "rendering prefix by prefix: give the template {% generation %} blocks")
        spans.append((len(asked), len(answered)))
    return spans


def _ids_and_byte_offsets(tokenizer: Tokenizer, text: str
                          ) -> tuple[list[int], list[tuple[int, int]]]:
    """(tokenizer.encode(text), each id's (start, end) byte range in text's UTF-8).

    The text is encoded whole (a piece may encode differently alone, e.g. a SentencePiece
    prefix space); each id spans the bytes it decodes to after the ids before it (a special
    token its name, a piece of a character included), as streaming decodes them. A tokenizer
    whose ids do not spell the text back (a word tokenizer, bytes it cannot encode) cannot say
    which ids are whose: UserError."""
    ids = tokenizer.encode(text)
    offsets: list[tuple[int, int]] = []
    at, prev = 0, None
    for i in ids:
        size = len(tokenizer._piece(i, prev, False))  # (streaming.py's per-token bytes)
        offsets.append((at, at + size))
        at, prev = at + size, i
    if at != len(text.encode("utf-8")):
        raise UserError(f"this {tokenizer.kind} tokenizer's ids do not spell the rendered "
                        "conversation back, so which tokens are the assistant's cannot be found")
    return ids, offsets


def shipped_fit_context(tokenizer: Tokenizer, messages: Sequence[Message], limit: int
                        ) -> tuple[list[int], int]:
    """As sheepop.tokenizers.chat_format.fit_context, for any template: whole turns dropped, oldest
    first (the system message, first, and the last turn kept), each candidate rendered whole."""
    head = 1 if messages[0]["role"] == "system" else 0
    cuts = [head] + [k for k in range(head + 1, len(messages)) if messages[k]["role"] == "user"]
    ids: list[int] = []
    for cut in cuts:
        kept = [*messages[:head], *messages[cut:]]
        check_contents(tokenizer, kept)
        ids = tokenizer.encode(render_messages(tokenizer, kept, True).text)
        if len(ids) <= limit:
            return ids, cut - head
    raise UserError(f"the {'system message and the ' if head else ''}last turn take {len(ids)} "
                    f"tokens, more than the {limit} the context leaves them")


def shipped_turn_end(tokenizer: Tokenizer) -> list[int]:
    """The ids that end an answer: the first special token the template writes after an
    answer (found by rendering one), then the end-of-sequence token; UserError when there is
    neither."""
    found: list[int] = []
    user = {"role": "user", "content": "?"}
    try:
        after = render_messages(tokenizer, [user, {"role": "assistant", "content": PROBE}]).text
    except UserError:  # a template that wants other conversations: the EOS alone says it
        after = ""
    start = after.rfind(PROBE)
    if start >= 0:
        rest = after[start + len(PROBE):]
        found += [i for _, i in tokenizer.split_specials(rest) if i is not None][:1]
    if tokenizer.eos_id is not None and tokenizer.eos_id not in found:
        found.append(tokenizer.eos_id)
    if not found:
        raise UserError("this tokenizer's chat template writes no special token after an "
                        "answer and it has no end-of-sequence token: nothing would end an "
                        "answer")
    return found
