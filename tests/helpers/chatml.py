"""A small tokenizer that ships a model's own chat template, as a real model's does: a sheepop
`bpe` trained on a little text with ChatML's special tokens, carrying SmolLM2's template
(copied as data from the GGUF metadata `tokenizer.chat_template` of SmolLM2-135M-Instruct),
and its twin in `transformers` (the same tokenizer exported as tokenizer.json)."""

from __future__ import annotations

from pathlib import Path

from tok_samples import PROSE

from sheepop.tokenizers import Tokenizer, train_tokenizer

SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}")

CHATML_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEXT = PROSE * 2 + "You are a helpful AI assistant named SmolLM, trained by Hugging Face\n" \
    "system user assistant: what is the capital of France? Paris.\n"


def chatml_tokenizer(template: str = SMOLLM2_TEMPLATE, vocab_size: int = 360,
                     specials: list[str] | None = None, text: str = TEXT) -> Tokenizer:
    """The bpe tokenizer with ChatML's special tokens (the last three ids) and `template`."""
    tok = train_tokenizer("bpe", [text], vocab_size=vocab_size,
                          special_tokens=specials or CHATML_SPECIALS)
    tok.chat_template = template
    return tok


def hf_twin(tok: Tokenizer, directory: Path):
    """`tok` as a transformers PreTrainedTokenizerFast (its exported tokenizer.json), with the
    same chat template and named special tokens."""
    from transformers import PreTrainedTokenizerFast

    from sheepop.tokenizers.hf import export_hf
    export_hf(tok, directory / "tokenizer.json")
    named = {"bos_token": tok.bos_id, "eos_token": tok.eos_id, "unk_token": tok.unk_id,
             "pad_token": tok.pad_id}
    hf = PreTrainedTokenizerFast(tokenizer_file=str(directory / "tokenizer.json"),
                                 **{k: tok.id_to_token(i) for k, i in named.items()
                                    if i is not None})
    hf.chat_template = tok.chat_template
    return hf
