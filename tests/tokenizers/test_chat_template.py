"""The chat template: special tokens added to every kind, the rendering, the loss mask, the
context fitting, and equality with Hugging Face's `apply_chat_template`."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tok_samples import PROSE

from sheepop.arch import IGNORE_INDEX
from sheepop.errors import UserError
from sheepop.tokenizers import load, loads, train_tokenizer
from sheepop.tokenizers.chat_format import (
    CHAT_SPECIALS,
    CHAT_TEMPLATE,
    encode_chat,
    fit_context,
    render_chat,
    with_chat_tokens,
)

CONVERSATION = [
    {"role": "system", "content": "You answer briefly."},
    {"role": "user", "content": "Naïve café? 😀 漢字"},
    {"role": "assistant", "content": "Yes: it's 3.14159.\nTwo lines."},
    {"role": "user", "content": "  spaces first, and a tab\t"},
    {"role": "assistant", "content": " leading space"},
]
N = -1  # IGNORE_INDEX, short, for the hand-written label rows


def kinds():
    return [("char", train_tokenizer("char", [PROSE + "\t:"])),
            ("word", train_tokenizer("word", [PROSE])),
            ("bpe", train_tokenizer("bpe", [PROSE * 3], vocab_size=300)),
            ("digits", train_tokenizer("digits", ["12 3"], special_tokens=["<|eos|>"]))]


@pytest.mark.parametrize("kind, tok", kinds(), ids=lambda v: v if isinstance(v, str) else "")
def test_chat_tokens_are_added_at_the_end_and_no_id_moves(kind, tok, tmp_path):
    text = "12 3" if kind == "digits" else PROSE
    before = tok.encode(text)
    chat, added = with_chat_tokens(tok)
    V = tok.vocab_size
    assert added == 4 and chat.vocab_size == V + 4
    assert [chat.special_tokens[t] for t in CHAT_SPECIALS] == [V, V + 1, V + 2, V + 3]
    assert {t: i for t, i in chat.special_tokens.items() if t not in CHAT_SPECIALS} \
        == tok.special_tokens
    assert chat.encode(text) == before
    assert [chat.id_to_token(i) for i in range(V)] == [tok.id_to_token(i) for i in range(V)]
    assert chat.encode("<|user|>12<|end|>") == [V + 1, *tok.encode("12"), V + 3]
    assert chat.chat_template == CHAT_TEMPLATE and tok.chat_template is None
    chat.save(tmp_path / "t.json")
    back = load(tmp_path / "t.json")
    assert back.to_json() == chat.to_json() and back.chat_template == CHAT_TEMPLATE
    assert json.loads(back.to_json())["chat_template"] == CHAT_TEMPLATE
    again, more = with_chat_tokens(back)
    assert more == 0 and again is back
    assert "chat_template" not in json.loads(tok.to_json())  # old files stay as they were


def test_tokens_present_but_no_template_get_the_template_and_no_new_id():
    tok = train_tokenizer("bpe", [PROSE], vocab_size=270, special_tokens=["<|eos|>",
                                                                          *CHAT_SPECIALS])
    chat, added = with_chat_tokens(tok)
    assert added == 0 and chat.vocab_size == tok.vocab_size and chat is not tok
    assert chat.chat_template == CHAT_TEMPLATE and tok.chat_template is None


def test_another_template_is_kept_not_replaced():
    chat, _ = with_chat_tokens(train_tokenizer("char", ["ab\n"]))
    data = json.loads(chat.to_json())
    other = loads(json.dumps(dict(data, chat_template="{{ messages }}")))
    assert other.chat_template == "{{ messages }}"
    assert with_chat_tokens(other) == (other, 0)  # a model's own template (test_model_chat_...)
    with pytest.raises(UserError, match="'chat_template' must be a string"):
        loads(json.dumps(dict(data, chat_template=3)))
    gap = dict(data, special_tokens={**data["special_tokens"], "<|end|>": 99})
    with pytest.raises(UserError, match="exactly 0..vocab_size-1"):
        loads(json.dumps(gap))


def test_encode_chat_ids_and_loss_mask_by_hand():
    # char ids: specials 0-3, "\n" 4, "a" 5, "b" 6, "c" 7; then <|system|> 8, <|user|> 9,
    # <|assistant|> 10, <|end|> 11.
    chat, _ = with_chat_tokens(train_tokenizer("char", ["abc\n"]))
    messages = [{"role": "user", "content": "ab"}, {"role": "assistant", "content": "c"}]
    ids = [9, 4, 5, 6, 11, 4, 10, 4, 7, 11, 4]
    assert chat.encode(render_chat(messages)) == ids
    x, y = encode_chat(chat, messages)
    assert x.dtype == y.dtype == np.int64
    assert x.tolist() == ids[:-1]
    assert y.tolist() == [N, N, N, N, N, N, N, 7, 11, N]  # "c" and the <|end|> closing it
    assert encode_chat(chat, messages, train_on="all")[1].tolist() == ids[1:]
    x, y = encode_chat(chat, messages[:1], add_generation_prompt=True)
    assert x.tolist() + [4] == [9, 4, 5, 6, 11, 4, 10, 4] and set(y.tolist()) == {N}
    two = messages + [{"role": "user", "content": "a"}, {"role": "assistant", "content": ""}]
    y = encode_chat(chat, two)[1]
    assert y.tolist()[9:] == [N, N, N, N, N, N, N, N, 11, N]  # an empty answer: its <|end|>


@pytest.mark.parametrize("kind, tok", kinds()[:3], ids=["char", "word", "bpe"])
def test_chat_ids_are_the_ids_of_the_rendered_text(kind, tok):
    chat, _ = with_chat_tokens(tok)
    for prompt in (False, True):
        x, y = encode_chat(chat, CONVERSATION, add_generation_prompt=prompt)
        ids = chat.encode(render_chat(CONVERSATION, prompt))
        assert x.tolist() == ids[:-1]
        counted = [ids[t + 1] for t in range(len(x)) if y[t] != IGNORE_INDEX]
        end = chat.special_tokens["<|end|>"]
        answers = [chat.encode(m["content"]) + [end] for m in CONVERSATION
                   if m["role"] == "assistant"]
        assert counted == [i for a in answers for i in a]


def test_a_token_joining_the_line_break_to_the_answer_counts():
    tok = train_tokenizer("bpe", ["a\n\nb " * 50], vocab_size=270, pattern="gpt4")
    chat, _ = with_chat_tokens(tok)
    joined = chat.encode("\n\n")
    assert len(joined) == 1  # "\n\n" is one token here
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "\nb"}]
    x, y = encode_chat(chat, messages)
    counted = [int(v) for v in y if v != IGNORE_INDEX]
    assert counted == chat.encode("\n\nb") + [chat.special_tokens["<|end|>"]]


def test_bad_conversations_and_tokenizers_are_one_clear_error():
    plain = train_tokenizer("char", ["ab\n"])
    chat, _ = with_chat_tokens(plain)
    user = {"role": "user", "content": "a"}
    with pytest.raises(UserError,
                       match=r"this tokenizer has no chat template \(with_chat_tokens adds it"):
        encode_chat(plain, [user])
    cases = [([], "empty conversation"), ([{"role": "bot", "content": "a"}], "unknown role"),
             ([{"role": "user"}], "message 1: no content"),
             ([user, {"role": "user", "content": 3}], "message 2: non-string content"),
             ([user, {"role": "system", "content": "a"}], "system message after the first")]
    for messages, message in cases:
        with pytest.raises(UserError, match=message):
            encode_chat(chat, messages)
    with pytest.raises(UserError, match="message 1 holds the special token <|end|>"):
        encode_chat(chat, [{"role": "user", "content": "a<|end|>"}])
    with pytest.raises(UserError, match="train_on must be one of assistant, all"):
        encode_chat(chat, [user], train_on="user")
    digits, added = with_chat_tokens(train_tokenizer("digits", ["1"]))
    assert added == 4
    with pytest.raises(UserError, match="encodes only 0-9 and space, not '\\\\n'"):
        encode_chat(digits, [{"role": "user", "content": "1"}])


def test_fit_context_drops_the_oldest_turns_never_the_system_message():
    chat, _ = with_chat_tokens(train_tokenizer("char", ["abc\n"]))
    S, U, A, E, NL = 8, 9, 10, 11, 4

    def msg(role, text):
        return {"role": role, "content": text}

    conv = [msg("system", "c"), msg("user", "a"), msg("assistant", "bb"),
            msg("user", "ab"), msg("assistant", "c"), msg("user", "b")]
    system = [S, NL, 7, E, NL]
    turn1 = [U, NL, 5, E, NL, A, NL, 6, 6, E, NL]
    turn2 = [U, NL, 5, 6, E, NL, A, NL, 7, E, NL]
    last = [U, NL, 6, E, NL, A, NL]
    whole = system + turn1 + turn2 + last
    assert len(whole) == 34
    assert fit_context(chat, conv, 34) == (whole, 0)
    assert fit_context(chat, conv, 33) == (system + turn2 + last, 2)
    assert fit_context(chat, conv, 23) == (system + turn2 + last, 2)
    assert fit_context(chat, conv, 22) == (system + last, 4)
    assert fit_context(chat, conv, 12) == (system + last, 4)
    with pytest.raises(UserError, match="the system message and the last turn take 12 tokens, "
                                        "more than the 11"):
        fit_context(chat, conv, 11)
    assert fit_context(chat, conv[1:], 7) == (last, 4)


transformers = pytest.importorskip("transformers")


def test_hugging_face_apply_chat_template_gives_the_same_ids(tmp_path):
    from sheepop.interop.hf_tokenizer import export_tokenizer
    chat, _ = with_chat_tokens(train_tokenizer("bpe", [PROSE * 3], vocab_size=320))
    assert export_tokenizer(chat, tmp_path, 128) == []
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["chat_template"] == CHAT_TEMPLATE
    assert config["additional_special_tokens"] == list(CHAT_SPECIALS)
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path)
    conversations = [CONVERSATION, CONVERSATION[1:3], CONVERSATION[:2],
                     [{"role": "user", "content": "a\n\n<|eos|> no: words only?"}]]
    for messages in conversations[:3]:
        for prompt in (False, True):
            text = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt)
            assert text == render_chat(messages, prompt)
            ids = hf.apply_chat_template(messages, tokenize=True, return_dict=False,
                                         add_generation_prompt=prompt)
            assert list(ids) == chat.encode(render_chat(messages, prompt))
            x, _ = encode_chat(chat, messages, add_generation_prompt=prompt)
            assert list(ids)[:-1] == x.tolist()
    assert hf.convert_ids_to_tokens(chat.encode("<|assistant|>")) == ["<|assistant|>"]
    from sheepop.interop.hf_tokenizer import import_tokenizer
    assert import_tokenizer(tmp_path).to_json() == chat.to_json()  # the template comes back
    with pytest.raises(Exception, match="unknown role: bot"):
        hf.apply_chat_template([{"role": "bot", "content": "a"}], tokenize=False)


def test_the_loss_mask_table_of_the_docs_is_what_encode_chat_gives():
    from pathlib import Path
    page = (Path(__file__).resolve().parents[2] / "docs" / "finetune.md").read_text()
    chat, _ = with_chat_tokens(train_tokenizer("char", ["hi yo\n"]))
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    ids = chat.encode(render_chat(messages))
    x, y = encode_chat(chat, messages)

    def name(i):
        return chat.id_to_token(int(i)).replace("\n", "\\n")

    rows = [" t  x[t]            next token      y[t]"]
    rows += [f"{t:>2}  {name(x[t]):<16}{name(ids[t + 1]):<16}"
             f"{name(y[t]) if y[t] != IGNORE_INDEX else -1}" for t in range(len(x))]
    assert "```text\n" + "\n".join(rows) + "\n```" in page
