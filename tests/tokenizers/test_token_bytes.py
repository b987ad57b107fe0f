"""Bytes per token and bits per byte (sheepop.tokenizers.token_bytes): the bytes the scored
targets stand for add up to the bytes of exactly the text they encode, for every kind."""

import math

import numpy as np
import pytest
from tok_samples import PROSE, VARIED

from sheepop.data.windows import eval_windows
from sheepop.tokenizers import train_tokenizer
from sheepop.tokenizers.token_bytes import TargetBytes, bits_per_byte, token_bytes


def stream_bytes(tok, ids) -> int:
    """Bytes of the targets ids[1:] of one stream (x = ids[:-1] holds the token before each)."""
    ids = np.asarray(ids, dtype=np.int64)[None]
    return TargetBytes(tok).count(ids[:, :-1], ids[:, 1:])


def test_char_tokens_count_their_utf8_length_and_specials_none():
    tok = train_tokenizer("char", ["aé日😀"])
    table = token_bytes(tok)
    assert table.tolist() == [0, 0, 0, 0, 1, 2, 3, 4]  # <|bos|> <|eos|> <|pad|> <|unk|> a é 日 😀
    text = "日本é a日"  # 本 and the space are unknown: <|unk|> counts no byte
    ids = tok.encode(text, add_eos=True)
    assert stream_bytes(tok, ids) == 0 + 2 + 0 + 1 + 3 + 0  # 本 é ' ' a 日 <|eos|>


def test_ascii_char_text_has_one_byte_per_target_so_bpb_is_loss_over_ln2():
    text = "the quick brown fox. " * 3
    tok = train_tokenizer("char", [text])
    ids = tok.encode(text)
    assert stream_bytes(tok, ids) == len(text) - 1 == len(ids) - 1
    loss, n = 1.3, len(ids) - 1
    assert bits_per_byte(loss * n, stream_bytes(tok, ids)) == pytest.approx(1.3 / math.log(2),
                                                                           rel=1e-15)


def test_multibyte_text_counts_bytes_not_characters():
    text = "café 日本語, naïve"
    tok = train_tokenizer("char", [text])
    ids = tok.encode(text)
    assert len(ids) == 15 and len(text.encode("utf-8")) == 23  # é ï: 2 bytes, 日本語: 3 each
    assert stream_bytes(tok, ids) == 23 - 1  # every target but the first character 'c'
    # 14 targets scored with 2 nats each: 28 nats over 22 bytes, not over 14 characters
    assert bits_per_byte(28.0, 22) == pytest.approx(28 / (22 * math.log(2)), rel=1e-15)


def test_byte_level_bpe_partial_characters_add_up_to_the_text_bytes():
    tok = train_tokenizer("bpe", [PROSE], vocab_size=300)
    ids = tok.encode(PROSE)
    table = token_bytes(tok)
    partial = [i for i in ids if not _valid_utf8(tok.tokens[i])]
    assert partial, "the test needs tokens that are pieces of a multi-byte character"
    assert int(table[ids].sum()) == len(PROSE.encode("utf-8"))
    assert stream_bytes(tok, ids) == len(PROSE.encode("utf-8")) - table[ids[0]]
    assert [table[tok.special_tokens[t]] for t in ("<|bos|>", "<|eos|>", "<|pad|>")] == [0, 0, 0]
    for text in VARIED:  # special tokens written in the text are markup, not counted
        names = sum(len(t) * text.count(t) for t in tok.special_tokens)
        assert int(table[tok.encode(text)].sum()) == len(text.encode("utf-8")) - names, text


def _valid_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def test_word_targets_count_the_word_and_the_space_decode_puts_before_it():
    text = "Hello, world (again).\nYes! Hello world."
    tok = train_tokenizer("word", [text])
    ids = tok.encode(text)
    assert tok.decode(ids) == text  # ordinary prose: the decoded text is the original
    assert stream_bytes(tok, ids) == len(text) - len("Hello")
    # "world" after "Hello" takes a space, "." after "world" does not: 6 + 1
    x, y = tok.encode("Hello world ."), tok.encode("world .")
    assert TargetBytes(tok).count(np.array([x[:2]]), np.array([y])) == 7
    unk = tok.encode("Hello zebra")
    assert tok.decode(unk) == "Hello <|unk|>" and stream_bytes(tok, unk) == 1  # only the space


def test_word_rule_equals_decode_on_random_id_sequences():
    tok = train_tokenizer("word", [PROSE + "(a) [b] {c} x% d: e; f\n g."])
    rng = np.random.default_rng(0)
    names = {i: t for t, i in tok.special_tokens.items()}
    for _ in range(200):
        ids = rng.integers(0, tok.vocab_size, 30).tolist()
        specials = sum(len(names[i]) for i in ids[1:] if i in names)
        expected = len(tok.decode(ids).encode()) - len(tok.decode(ids[:1]).encode()) - specials
        assert stream_bytes(tok, ids) == expected, tok.decode(ids)


def test_padded_windows_count_only_the_scored_targets():
    text = "ab日cd"  # 6 tokens with the EOS: 5 targets, windows of 4 leave a padded tail
    tok = train_tokenizer("char", [text])
    ids = np.asarray(tok.encode(text, add_eos=True))
    x, y = eval_windows(ids, 4, 10, tok.pad_id)
    assert (y == -1).sum() == 3
    assert TargetBytes(tok).count(x, y) == len("b日cd".encode()) == 6
    # windows of 2 start at 0, 2, 4; two of them spread evenly are the first and the last:
    # targets b 日 and <|eos|> (then padding), the c d of the middle one not scored
    x2, y2 = eval_windows(ids, 2, 2, tok.pad_id)
    assert x2[:, 0].tolist() == [tok.encode("a")[0], tok.encode("d")[0]]
    assert TargetBytes(tok).count(x2, y2) == len("b日".encode()) == 4


def test_digits_are_one_byte_each():
    tok = train_tokenizer("digits", ["1 2"], special_tokens=["<|eos|>"])
    assert token_bytes(tok).tolist() == [1] * 11 + [0]


def test_bits_per_byte_values():
    assert bits_per_byte(10 * math.log(2), 5) == pytest.approx(2.0, rel=1e-15)
    assert bits_per_byte(3.0, 0) is None
