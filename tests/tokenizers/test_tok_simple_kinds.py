"""The char, digits and word tokenizers: exact vocabularies, ids and decoded text."""

from __future__ import annotations

import pytest
from tok_samples import PROSE

from sheepop.errors import UserError
from sheepop.tokenizers import IncrementalDecoder, load, loads, train_tokenizer
from sheepop.tokenizers.char import CharTokenizer
from sheepop.tokenizers.digits import DigitsTokenizer
from sheepop.tokenizers.word import WordTokenizer

# ----- char -----------------------------------------------------------------------------------


def test_char_vocabulary_is_specials_then_sorted_characters():
    tok = train_tokenizer("char", ["hello", "world!"])
    assert isinstance(tok, CharTokenizer)
    assert tok.special_tokens == {"<|bos|>": 0, "<|eos|>": 1, "<|pad|>": 2, "<|unk|>": 3}
    assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.unk_id) == (0, 1, 2, 3)
    assert tok.chars == ["!", "d", "e", "h", "l", "o", "r", "w"]
    assert tok.vocab_size == 12
    assert tok.encode("hello") == [7, 6, 8, 8, 9]
    assert tok.encode("hi", add_bos=True, add_eos=True) == [0, 7, 3, 1]
    assert tok.decode([7, 6, 8, 8, 9]) == "hello"
    assert tok.id_to_token(4) == "!" and tok.token_to_id("w") == 11
    assert tok.token_to_id("<|eos|>") == 1 and tok.token_to_id("z") is None


def test_char_round_trip_unknown_and_special_text():
    text = PROSE
    tok = train_tokenizer("char", [text])
    assert tok.decode(tok.encode(text)) == text
    assert tok.count_unknown(text) == 0
    assert tok.encode("Q€") == [tok.unk_id] * 2
    assert tok.count_unknown("Q€T") == 2
    # Special tokens written in the text are one id each, and skip_special drops them.
    ids = tok.encode("The<|eos|>")
    assert ids[-1] == tok.eos_id and len(ids) == 4
    assert tok.decode(ids) == "The<|eos|>"
    assert tok.decode(ids, skip_special=True) == "The"


def test_char_vocab_size_keeps_the_most_frequent_characters():
    tok = train_tokenizer("char", ["aaaa bbb cc d"], vocab_size=7)
    assert tok.chars == [" ", "a", "b"]  # 4 specials + 3 most frequent, stored in order
    assert tok.encode("abcd") == [5, 6, 3, 3]
    with pytest.raises(UserError, match="no room"):
        train_tokenizer("char", ["abc"], vocab_size=4)


def test_char_save_load(tmp_path):
    tok = train_tokenizer("char", [PROSE])
    path = tmp_path / "sub" / "char.json"
    tok.save(path)
    again = load(path)
    assert isinstance(again, CharTokenizer)
    assert again.to_json() == tok.to_json()
    assert again.encode(PROSE) == tok.encode(PROSE)


# ----- digits ---------------------------------------------------------------------------------


def test_digits_has_exactly_eleven_ids():
    tok = train_tokenizer("digits", ["12 34"])
    assert isinstance(tok, DigitsTokenizer)
    assert tok.vocab_size == 11 and tok.special_tokens == {}
    assert [tok.id_to_token(i) for i in range(11)] == list("0123456789 ")
    assert tok.encode("907 12") == [9, 0, 7, 10, 1, 2]
    assert tok.decode([9, 0, 7, 10, 1, 2]) == "907 12"
    assert tok.bos_id is None and tok.eos_id is None and tok.count_unknown("12") == 0
    with pytest.raises(UserError, match="not 'x'"):
        tok.encode("1x")
    with pytest.raises(UserError, match="no <\\|eos\\|> token"):
        tok.encode("1", add_eos=True)
    with pytest.raises(UserError, match="exactly 11 ids"):
        train_tokenizer("digits", ["1"], vocab_size=12)


def test_digits_specials_only_when_asked_for():
    tok = train_tokenizer("digits", ["5"], special_tokens=["<|eos|>", "<|pad|>"])
    assert tok.vocab_size == 13 and tok.special_tokens == {"<|eos|>": 11, "<|pad|>": 12}
    assert tok.encode("5 6", add_eos=True) == [5, 10, 6, 11]
    assert tok.decode([5, 11, 12], skip_special=True) == "5"
    again = loads(tok.to_json())
    assert again.special_tokens == tok.special_tokens
    with pytest.raises(UserError, match="outside the vocabulary"):
        tok.decode([13])


# ----- word -----------------------------------------------------------------------------------


def test_word_vocabulary_by_frequency_then_code_point():
    tok = train_tokenizer("word", ["the cat sat. The cat ran!\nthe end"])
    assert isinstance(tok, WordTokenizer)
    assert tok.words == ["cat", "the", "\n", "!", ".", "The", "end", "ran", "sat"]
    assert tok.encode("the cat ran.") == [5, 4, 11, 8]
    assert tok.encode("the dog") == [5, tok.unk_id]


def test_word_min_freq_and_max_vocab():
    texts = ["a a a b b c"]
    assert train_tokenizer("word", texts, min_freq=2).words == ["a", "b"]
    assert train_tokenizer("word", texts, max_vocab=5).words == ["a"]
    assert train_tokenizer("word", texts, vocab_size=6).words == ["a", "b"]
    with pytest.raises(UserError, match="min_freq"):
        train_tokenizer("word", texts, min_freq=0)
    with pytest.raises(UserError, match="no word occurs"):
        train_tokenizer("word", texts, min_freq=9)


def test_word_decode_restores_prose_spacing():
    text = "Hello, world! The cat (a big one) sat.\nDon't stop: 100% sure?"
    tok = train_tokenizer("word", [text])
    assert tok.decode(tok.encode(text)) == text
    # Unknown words keep their place, spaced like words.
    assert tok.decode(tok.encode("Hello, moon!")) == "Hello, <|unk|>!"
    assert tok.decode(tok.encode("Hello", add_bos=True, add_eos=True)) == \
        "<|bos|>Hello<|eos|>"


def test_word_streamed_decode_equals_decode():
    text = "Hello, world! (a b) c.\nd"
    tok = train_tokenizer("word", [text])
    ids = tok.encode(text)
    dec = IncrementalDecoder(tok)
    assert "".join(dec.step(i) for i in ids) + dec.flush() == tok.decode(ids) == text


def test_word_lowercase_and_file(tmp_path):
    tok = train_tokenizer("word", ["Apple apple APPLE pie"], lowercase=True)
    assert tok.words == ["apple", "pie"]
    assert tok.encode("APPLE Pie") == [4, 5]
    tok.save(tmp_path / "w.json")
    again = load(tmp_path / "w.json")
    assert again.lowercase and again.encode("APPLE Pie") == [4, 5]
