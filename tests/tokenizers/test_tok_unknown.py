"""What a tokenizer cannot write (`Tokenizer.unknown_pieces`, `count_unknown`), for every kind:
the pieces mapped to <|unk|> and, for a byte-level vocabulary without some bytes (SmolLM2's),
the characters it drops, compared with Hugging Face `tokenizers` on the same file."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from sheepop.tokenizers import train_tokenizer
from sheepop.tokenizers.unknown import unknown_warning

CORPUS = ["the quick brown fox jumps over the lazy dog. 12 sheep."]


def test_char_word_digits_and_bpe_count_what_they_cannot_write():
    char = train_tokenizer("char", CORPUS, 0)
    assert char.unknown_pieces("the Ünïcode ☃☃ fox") == Counter({"Ü": 1, "ï": 1, "☃": 2})
    assert char.count_unknown("<|eos|>the fox") == 0  # a special token is no unknown piece
    word = train_tokenizer("word", CORPUS, 0)
    assert word.unknown_pieces("the quick cat and the cat") == Counter({"cat": 2, "and": 1})
    assert train_tokenizer("bpe", CORPUS, 260).count_unknown("anything ☃ 日本") == 0
    digits = train_tokenizer("digits", ["12 34"], 0)
    assert digits.unknown_pieces("12 a4") == Counter({"a": 1})  # refused by its encode


def test_the_warning_counts_and_shows_the_commonest():
    char = train_tokenizer("char", CORPUS, 0)
    pieces = char.unknown_pieces("ÜÜÜ ☃ ☃")
    assert unknown_warning(char, pieces, "the prompt") == (
        "warning: 5 characters of the prompt are not in the vocabulary, encoded as the unknown "
        "token (e.g. 'Ü' x3, '☃' x2)")
    assert unknown_warning(char, char.unknown_pieces("the fox"), "the prompt") is None
    word = train_tokenizer("word", CORPUS, 0)
    assert unknown_warning(word, word.unknown_pieces("cat"), "the data") == (
        "warning: 1 word of the data is not in the vocabulary, encoded as the unknown token "
        "(e.g. 'cat' x1)")


@pytest.mark.real_model
def test_smollm2s_dropped_bytes_are_unknown_as_tokenizers_round_trips_them(smollm2_gguf_path):
    """SmolLM2's byte-level vocabulary lacks a few control bytes: encoding drops them (no
    <|unk|> says so). The characters counted unknown are exactly those whose round trip
    through `tokenizers` (the same tokenizer.json) does not give them back."""
    tokenizers = pytest.importorskip("tokenizers")
    from sheepop.interop.gguf import read_gguf
    from sheepop.tokenizers.gguf_vocab import tokenizer_from_gguf
    gguf = read_gguf(smollm2_gguf_path)
    tok = tokenizer_from_gguf(gguf.meta, gguf.where)
    reference = tokenizers.Tokenizer.from_str(json.dumps(tok._hf))
    chars = [chr(i) for i in range(0x250)] + list("日本語☃€😀")
    lost = {c for c in chars if reference.decode(reference.encode(c).ids) != c}
    assert lost  # the premise: some characters do not survive
    text = "".join(c * 2 for c in chars)
    assert tok.unknown_pieces(text) == Counter({c: 2 for c in lost})
    assert tok.count_unknown(text) == 2 * len(lost)
