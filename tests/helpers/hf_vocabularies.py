"""Small vocabularies of the shapes real models use, trained with Hugging Face `tokenizers` (the
reference), for tests of sheepop's pretrained tokenizer (sheepop.tokenizers.pretrained).

Each builder returns a `tokenizers.Tokenizer`; `json.loads(tok.to_str())` is its tokenizer.json.
"""

from __future__ import annotations

import json

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

BROAD_TEXT = (
    "The quick brown fox jumps over the lazy dog. It's 3.14159 o'clock; WE'VE paid $1,234,567.\n"
    "Привет, мир! Καλημέρα κόσμε. 你好，世界。こんにちは世界 안녕하세요 مرحبا بالعالم שלום "
    "नमस्ते दुनिया Cửa Việt café naïve Ñandú\n"
    "def f(x):\n\treturn x**2 + 3.14  # comment\n\n\n    if x   >=  10:   pass\r\n"
    "Emoji: 😀👍🏽👨‍👩‍👧‍👦 🇫🇷 ❤️ ½ ² Ⅻ ١٢٣\n"
    "Control: \x00\x01\x04\x07\x1b[0m\x7f\x85 end.    \t\t\n\n\n   trailing   ")
"""Prose in several scripts, code, whitespace runs, emoji, digits of several kinds, control
characters (bytes a byte-level vocabulary may lack)."""

LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def _train(tok: Tokenizer, corpus: list[str], vocab_size: int, specials: list[str],
           byte_alphabet: bool = True) -> Tokenizer:
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet() if byte_alphabet else [])
    tok.train_from_iterator(corpus, trainer)
    return tok


def gpt2_style(corpus: list[str]) -> Tokenizer:
    """GPT-2: ByteLevel with its own regex, no prefix space."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return _train(tok, corpus, 700, ["<|endoftext|>"])


def llama3_style(corpus: list[str]) -> Tokenizer:
    """Llama 3: Split on Llama 3's regex, ByteLevel without a regex, ignore_merges."""
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), "isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    return _train(tok, corpus, 700, ["<|begin_of_text|>", "<|end_of_text|>"])


def smollm_style(corpus: list[str]) -> Tokenizer:
    """SmolLM2: each digit alone, then ByteLevel with GPT-2's regex."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    return _train(tok, corpus, 700, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"])


def sentencepiece_style(corpus: list[str]) -> Tokenizer:
    """Llama 2 / Mistral / TinyLlama: ▁ for spaces from the normalizer (Prepend + Replace), no
    pre-tokenizer, byte_fallback to <0xNN> tokens of the model's vocabulary, <unk> fused, the
    post-processor's BOS, and the decoder chain Replace / ByteFallback / Fuse / Strip.
    Trained through Metaspace, then rewritten by hand into that shape."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    specials = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))]
    _train(tok, corpus, 600, specials, byte_alphabet=False)
    tj = json.loads(tok.to_str())
    tj["added_tokens"] = [t for t in tj["added_tokens"] if t["content"] in specials[:3]]
    tj["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "▁"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}
    tj["pre_tokenizer"] = None
    tj["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    tj["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                   {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}
    return Tokenizer.from_str(json.dumps(tj))


def spaced_merges_style(corpus: list[str]) -> Tokenizer:
    """Tokens that hold spaces (no ▁, no byte map: each line is one word), so tokenizer.json
    writes the merges as [left, right] pairs."""
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("\n"), "isolated")
    return _train(tok, corpus, 400, ["[UNK]"], byte_alphabet=False)
