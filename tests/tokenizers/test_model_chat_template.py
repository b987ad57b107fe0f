"""A model's own chat template (sheepop.tokenizers.chat_template, chat_shipped): rendered in a
sandbox as `transformers` renders it, the same ids as its apply_chat_template, the loss mask
(from {% generation %} blocks, equal to transformers' assistant mask; else prefix by prefix,
checked id by id on SmolLM2's template), the end of a turn, context fitting, and the refusals
(raise_exception, the sandbox, a template that does not parse)."""

from __future__ import annotations

import jinja2
import pytest
from chatml import SMOLLM2_TEMPLATE, TEXT, chatml_tokenizer, hf_twin

from sheepop.arch import IGNORE_INDEX
from sheepop.errors import UserError
from sheepop.tokenizers import train_tokenizer
from sheepop.tokenizers.chat_format import (
    can_chat,
    chat_ids,
    encode_chat,
    fit_context,
    has_chat_tokens,
    require_chat_tokens,
    turn_end,
    with_chat_tokens,
)
from sheepop.tokenizers.chat_shipped import render_messages
from sheepop.tokenizers.chat_template import has_generation_blocks, render

transformers = pytest.importorskip("transformers")

SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging " \
    "Face<|im_end|>\n"
GENERATION_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\n' }}"
    "{% else %}{{ message['content'] + '<|im_end|>\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You answer briefly."},
     {"role": "user", "content": "Naïve café? 😀 漢字"},
     {"role": "assistant", "content": "Yes: it's 3.14159.\nTwo lines."},
     {"role": "user", "content": "  spaces first, and a tab\t"},
     {"role": "assistant", "content": "\n\nleading line breaks and é😀"}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": ""}],
]


@pytest.fixture(scope="module")
def smol():
    return chatml_tokenizer()


@pytest.fixture(scope="module")
def smol_hf(smol, tmp_path_factory):
    return hf_twin(smol, tmp_path_factory.mktemp("smol"))


def test_smollm2s_template_gives_the_ids_of_apply_chat_template(smol, smol_hf):
    assert can_chat(smol) and not has_chat_tokens(smol)
    require_chat_tokens(smol)
    for messages in CONVERSATIONS:
        for prompt in (False, True):
            text = smol_hf.apply_chat_template(messages, add_generation_prompt=prompt,
                                               tokenize=False)
            assert render_messages(smol, messages, prompt).text == text
            ids = smol_hf.apply_chat_template(messages, add_generation_prompt=prompt,
                                              tokenize=True, return_dict=False)
            assert chat_ids(smol, messages, prompt)[0] == list(ids)
            x, _ = encode_chat(smol, messages, add_generation_prompt=prompt)
            assert x.tolist() == list(ids)[:-1]
    assert render_messages(smol, CONVERSATIONS[0], True).text == \
        SYSTEM + "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n" \
                 "<|im_start|>assistant\n"


def test_the_loss_mask_of_smollm2s_template_prefix_by_prefix(smol):
    """No {% generation %} blocks: what each assistant turn adds after its generation prompt
    (its answer, <|im_end|> and the line break after it) is the assistant's, nothing else."""
    E = smol.special_tokens["<|im_end|>"]
    enc = smol.encode
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Paris."},
                {"role": "user", "content": "and Spain?"},
                {"role": "assistant", "content": "Madrid."}]
    pieces = [(enc(SYSTEM + "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"), False),
              (enc("Paris.") + [E] + enc("\n"), True),
              (enc("<|im_start|>user\nand Spain?<|im_end|>\n<|im_start|>assistant\n"), False),
              (enc("Madrid.") + [E] + enc("\n"), True)]
    ids, own = chat_ids(smol, messages)
    assert ids == [i for p, _ in pieces for i in p]
    assert own == [mine for p, mine in pieces for _ in p]
    x, y = encode_chat(smol, messages)
    assert [int(v) for v in y if v != IGNORE_INDEX] == \
        enc("Paris.") + [E] + enc("\n") + enc("Madrid.") + [E] + enc("\n")
    assert set(encode_chat(smol, messages[:1], add_generation_prompt=True)[1].tolist()) == \
        {IGNORE_INDEX}
    assert encode_chat(smol, messages, train_on="all")[1].tolist() == ids[1:]


def test_generation_blocks_give_transformers_assistant_mask(tmp_path):
    tok = chatml_tokenizer(GENERATION_TEMPLATE, specials=["<|bos|>", "<|im_start|>",
                                                          "<|im_end|>"])
    hf = hf_twin(tok, tmp_path)
    assert has_generation_blocks(GENERATION_TEMPLATE)
    assert not has_generation_blocks(SMOLLM2_TEMPLATE)
    for messages in CONVERSATIONS:
        ids, own = chat_ids(tok, messages)
        ref = hf.apply_chat_template(messages, tokenize=True, return_dict=True,
                                     return_assistant_tokens_mask=True)
        assert ids == ref["input_ids"] and ids[0] == tok.special_tokens["<|bos|>"]
        assert own == [bool(m) for m in ref["assistant_masks"]]
    # By hand: the answer and its <|im_end|>, not the line break after it.
    E = tok.special_tokens["<|im_end|>"]
    ids, own = chat_ids(tok, [{"role": "user", "content": "hi"},
                              {"role": "assistant", "content": "Paris."}])
    assert [i for i, mine in zip(ids, own) if mine] == tok.encode("Paris.") + [E]
    # A first token that joins the prompt's line break to the answer is the assistant's.
    tok = chatml_tokenizer(GENERATION_TEMPLATE, text=TEXT + "a\n\n\nb " * 50)
    (joined,) = tok.encode("\n\n")
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "\n\nb"}]
    ids, own = chat_ids(tok, messages)
    assert joined in ids and own[ids.index(joined)]
    ref = hf_twin(tok, tmp_path).apply_chat_template(messages, tokenize=True, return_dict=True,
                                                     return_assistant_tokens_mask=True)
    assert own == [bool(m) for m in ref["assistant_masks"]]


def test_the_end_of_a_turn_is_the_token_the_template_closes_an_answer_with(smol):
    E = smol.special_tokens["<|im_end|>"]
    end = turn_end(smol)
    assert end.ids == {E} and end.eos_id == E
    assert sorted(end.stops) == ["<|endoftext|>", "<|im_start|>"]
    with_eos = chatml_tokenizer(specials=["<|eos|>", "<|im_start|>", "<|im_end|>"])
    end = turn_end(with_eos)
    assert end.eos_id == with_eos.special_tokens["<|im_end|>"]
    assert end.ids == {with_eos.special_tokens["<|im_end|>"], with_eos.eos_id}
    bare = chatml_tokenizer("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    with pytest.raises(UserError, match="writes no special token after an answer and it has "
                                        "no end-of-sequence token"):
        turn_end(bare)


def test_fit_context_drops_the_oldest_turns_through_the_template(smol):
    def msg(role, text):
        return {"role": role, "content": text}

    conv = [msg("system", "Be brief."), msg("user", "one"), msg("assistant", "1"),
            msg("user", "two"), msg("assistant", "2"), msg("user", "three")]
    whole = chat_ids(smol, conv, True)[0]
    after_one = chat_ids(smol, conv[:1] + conv[3:], True)[0]
    last = chat_ids(smol, conv[:1] + conv[5:], True)[0]
    assert fit_context(smol, conv, len(whole)) == (whole, 0)
    assert fit_context(smol, conv, len(whole) - 1) == (after_one, 2)
    assert fit_context(smol, conv, len(after_one) - 1) == (last, 4)
    with pytest.raises(UserError, match=f"the system message and the last turn take "
                                        f"{len(last)} tokens, more than the {len(last) - 1}"):
        fit_context(smol, conv, len(last) - 1)
    # Without a system message, SmolLM2's template writes its own, and every turn may go.
    only_last = chat_ids(smol, conv[5:], True)[0]
    assert only_last[:len(smol.encode(SYSTEM))] == smol.encode(SYSTEM)
    assert fit_context(smol, conv[1:], len(only_last)) == (only_last, 4)


def test_a_model_template_is_never_replaced_by_sheepops(smol):
    assert with_chat_tokens(smol) == (smol, 0)
    plain = train_tokenizer("bpe", ["no template here " * 20], vocab_size=270)
    with pytest.raises(UserError, match="this tokenizer has no chat template"):
        chat_ids(plain, CONVERSATIONS[0])
    with pytest.raises(UserError, match="message 1 holds the special token <|im_end|>"):
        chat_ids(smol, [{"role": "user", "content": "a<|im_end|>"}])


def test_raise_exception_is_one_clear_error_as_in_transformers(tmp_path):
    template = ("{% for m in messages %}{% if m['role'] == 'system' %}"
                "{{ raise_exception('System role not supported') }}{% endif %}"
                "{{ m['content'] }}{% endfor %}")
    tok = chatml_tokenizer(template)
    with pytest.raises(UserError, match=r"^the chat template refused the conversation: "
                                        r"System role not supported$"):
        chat_ids(tok, CONVERSATIONS[1])
    with pytest.raises(jinja2.TemplateError, match="System role not supported"):
        hf_twin(tok, tmp_path).apply_chat_template(CONVERSATIONS[1], tokenize=False)
    assert chat_ids(tok, CONVERSATIONS[0])[0] == tok.encode(CONVERSATIONS[0][0]["content"])


@pytest.mark.parametrize("template, what", [
    ("{{ cycler.__init__.__globals__ }}", "access to attribute '__init__'"),
    ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "'__class__'"),
    ("{{ messages.append(messages[0]) }}", "'append' of 'list'"),
    ("{% set ns = namespace() %}{% set ns._hidden = 1 %}", "may not begin with '_'"),
    ("{{ messages[0].update({'role': 'system'}) }}", "'update' of 'dict'"),
])
def test_the_sandbox_refuses_pythons_internals(template, what, tmp_path):
    tok = chatml_tokenizer(template)
    with pytest.raises(UserError, match="^the chat template reached for something its "
                                        "sandbox forbids: .*" + what):
        chat_ids(tok, CONVERSATIONS[0])
    with pytest.raises(jinja2.exceptions.SecurityError):  # transformers refuses it too
        hf_twin(tok, tmp_path).apply_chat_template(CONVERSATIONS[0], tokenize=False)


def test_the_environment_is_the_one_templates_are_written_for(tmp_path):
    """trim_blocks, lstrip_blocks, loop controls, tojson without HTML escaping, namespace,
    dict, strftime_now and the named special tokens: the same text as transformers."""
    template = ("{{ bos_token }}{{ eos_token }}\n"
                "{% set ns = namespace(n=0) %}\n"
                "  {% for m in messages %}\n"
                "    {% if loop.index > 2 %}{% break %}{% endif %}\n"
                "    {% set ns.n = ns.n + 1 %}\n"
                "{{ m | tojson }}|{{ dict(role=m['role']) | tojson(indent=1) }}\n"
                "  {% endfor %}\n"
                "{{ ns.n }} {{ strftime_now('%Y') }} {{ {'<b>': '&'} | tojson }}"
                "{% if tools is none and documents is none %} none{% endif %}")
    tok = chatml_tokenizer(template, specials=["<|bos|>", "<|eos|>", "<|im_end|>"])
    hf = hf_twin(tok, tmp_path)
    messages = CONVERSATIONS[1]
    ours = render_messages(tok, messages, False).text
    assert ours == hf.apply_chat_template(messages, tokenize=False)
    assert ours.startswith("<|bos|><|eos|>") and ours.endswith('{"<b>": "&"} none')
    assert "\n  " not in ours and ours.count("|{\n") == 2


def test_a_template_that_does_not_parse_or_fails_is_one_line():
    with pytest.raises(UserError, match=r"^the chat template does not parse: .* \(line 2\)$"):
        render("ok\n{% if %}", [], False)
    with pytest.raises(UserError, match="^the chat template failed: TypeError: "):
        render("{{ messages[0]['content'] + 1 }}", [{"role": "user", "content": "a"}], False)
    with pytest.raises(UserError, match="^the chat template failed: 'nothing' is undefined$"):
        render("{{ nothing.here }}", [], False)


def test_a_template_that_rewrites_earlier_turns_needs_generation_blocks():
    template = ("{% for m in messages %}{% if loop.last %}<|im_start|>{% endif %}"
                "{{ m['content'] }}<|im_end|>{% endfor %}")
    tok = chatml_tokenizer(template)
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                {"role": "user", "content": "c"}]
    with pytest.raises(UserError, match="renders message 2 .* differently once the "
                                        "conversation goes on"):
        chat_ids(tok, messages)
