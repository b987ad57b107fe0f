"""Byte-level BPE: training (fast == naive, determinism, stopping), encoding, decoding, files."""

from __future__ import annotations

from collections import Counter

import pytest
from tok_samples import PROSE, VARIED

from sheepop.errors import UserError
from sheepop.tokenizers import IncrementalDecoder, decode_stream, loads, train_tokenizer
from sheepop.tokenizers.bpe import BPETokenizer
from sheepop.tokenizers.bpe_train import count_words, merge_word, train_fast, train_naive
from sheepop.tokenizers.pretokenize import PATTERNS, compiled, safe_chunks, split_text


def test_merge_word_replaces_left_to_right_without_overlap():
    assert merge_word([1, 1, 1, 2, 1, 1], 1, 1, 9) == [9, 1, 2, 9]


@pytest.mark.parametrize("pattern", ["gpt2", "gpt4"])
def test_fast_and_naive_trainers_learn_the_same_merges(code_text, pattern):
    counts = count_words([code_text[:30_000], PROSE], PATTERNS[pattern], [])
    naive = train_naive(counts.items(), 256 + 250)
    fast = train_fast(counts.items(), 256 + 250)
    assert len(naive) == 250
    assert fast == naive


def test_trainers_agree_on_repetitive_words_and_reused_ids():
    # Overlapping pairs ("aaaa"), and merges that rebuild bytes an earlier merge already made
    # ("ab"+"c" and "a"+"bc"), which reuse the existing id instead of adding a token.
    counts = Counter({"aaaaaaa": 3, "abababab": 2, "ab": 5, "ba": 5, "bab": 1, "aabaab": 2,
                      "abc": 4, "xbc": 6, "bcx": 6, "zab": 3})
    naive = train_naive(counts.items(), 400)
    assert train_fast(counts.items(), 400) == naive
    tok = BPETokenizer.from_merged_bytes([], [], PATTERNS["gpt2"])
    assert tok.vocab_size == 256


def test_tie_break_highest_count_then_lowest_pair_in_byte_order():
    # ("a","b") and ("c","d") both occur 3 times; ("a","b") has the lower bytes, so comes first.
    merges = train_fast(Counter({"cd": 3, "ab": 3, "xy": 1}).items(), 259)
    assert merges == [(ord("a"), ord("b")), (ord("c"), ord("d")), (ord("x"), ord("y"))]
    # Here b"b" < b"c" decides between ("a","b") and ("a","c"): lowest left first, then right.
    merges = train_fast(Counter({"ac": 2, "ab": 2}).items(), 258)
    assert merges == [(ord("a"), ord("b")), (ord("a"), ord("c"))]


def test_training_is_deterministic_and_counts_specials(code_text):
    a = train_tokenizer("bpe", [code_text[:40_000]], vocab_size=600)
    b = train_tokenizer("bpe", [code_text[:40_000]], vocab_size=600)
    assert a.to_json() == b.to_json()
    assert a.vocab_size == 600 and len(a.merges) == 600 - 256 - 3
    assert a.special_tokens == {"<|bos|>": 597, "<|eos|>": 598, "<|pad|>": 599}
    assert all(a.tokens[i] == bytes([i]) for i in range(256))  # id b is byte b


def test_training_stops_cleanly_when_no_pair_is_left():
    tok = train_tokenizer("bpe", ["abab ab"], vocab_size=10_000)
    assert [tok.id_to_token(i) for i in range(256, 256 + len(tok.merges))] == \
        ["ab", "Ġab", "abab"]  # (" ", "ab") ties with ("ab", "ab"); b" " < b"ab"
    assert tok.vocab_size == 256 + 3 + 3
    tok = train_tokenizer("bpe", ["a"], vocab_size=300, special_tokens=[])
    assert tok.merges == [] and tok.vocab_size == 256


def test_specials_are_matched_whole_and_never_learned():
    text = "<|eos|>hello<|eos|>hello<|eos|>" * 20
    tok = train_tokenizer("bpe", [text], vocab_size=300)
    assert all(b"<|" not in t and b"|>" not in t for t in tok.tokens if t)
    ids = tok.encode("hello<|eos|><|bos|>")
    assert ids[-2:] == [tok.eos_id, tok.bos_id]
    assert tok.decode(ids) == "hello<|eos|><|bos|>"
    assert tok.decode(ids, skip_special=True) == "hello"
    assert tok.encode("x", add_bos=True, add_eos=True) == [tok.bos_id, ord("x"), tok.eos_id]
    assert tok.count_unknown("anything at all ☃") == 0 and tok.unk_id is None


def test_encoding_applies_merges_by_rank(bpe_tok):
    for text in VARIED + [PROSE]:
        ids = bpe_tok.encode(text)
        assert bpe_tok.decode(ids) == text
        # Reference: apply each merge in rank order to every word, the textbook way.
        ref = []
        for piece, special in bpe_tok.split_specials(text):
            if special is not None:
                ref.append(special)
                continue
            for word in split_text(bpe_tok._re, piece):
                w = list(word.encode("utf-8"))
                for a, b in bpe_tok.merges:
                    w = merge_word(w, a, b, bpe_tok._ranks[(a, b)][1])
                ref.extend(w)
        assert ids == ref


def test_every_single_id_decodes_and_streams_exactly(bpe_tok):
    for i in range(bpe_tok.vocab_size):
        assert isinstance(bpe_tok.decode([i]), str)
    text = "emoji 😀👍🏽 漢字 é"
    ids = bpe_tok.encode(text)
    assert any("\ufffd" in bpe_tok.decode([i]) for i in ids)  # some ids are partial UTF-8
    pieces = list(decode_stream(bpe_tok, ids))
    assert "".join(pieces) == text and all("\ufffd" not in p for p in pieces)


def test_partial_utf8_is_replaced_unless_strict(bpe_tok):
    ids = list("😀".encode())  # ids 0..255 are the bytes
    assert bpe_tok.decode(ids[:2]) == "\ufffd"
    with pytest.raises(UserError, match="not valid UTF-8"):
        bpe_tok.decode(ids[:2], errors="strict")
    dec = IncrementalDecoder(bpe_tok)
    assert [dec.step(i) for i in ids[:3]] == ["", "", ""]
    assert dec.flush() == "\ufffd"


def test_decode_rejects_ids_outside_the_vocabulary(bpe_tok):
    for bad in (-1, bpe_tok.vocab_size, 10**9):
        with pytest.raises(UserError, match="outside the vocabulary"):
            bpe_tok.decode([bad])
    with pytest.raises(UserError, match="must be an integer"):
        bpe_tok.decode(["7"])


def test_vocab_size_smaller_than_base_alphabet_and_empty_corpus():
    with pytest.raises(UserError, match=r"smaller than the base alphabet .*= 259"):
        train_tokenizer("bpe", ["abc"], vocab_size=258)
    for corpus in ([], ["", ""]):
        with pytest.raises(UserError, match="empty corpus"):
            train_tokenizer("bpe", corpus, vocab_size=300)
    with pytest.raises(UserError, match="invalid pre-split pattern"):
        train_tokenizer("bpe", ["abc"], vocab_size=300, pattern="(unclosed")


def test_id_to_token_is_invertible(bpe_tok):
    for i in range(bpe_tok.vocab_size):
        assert bpe_tok.token_to_id(bpe_tok.id_to_token(i)) == i
    assert bpe_tok.id_to_token(32) == "Ġ" and bpe_tok.id_to_token(10) == "Ċ"


def test_file_round_trip_keeps_pattern_and_ids(tmp_path):
    tok = train_tokenizer("bpe", [PROSE * 3], vocab_size=400, pattern="gpt4",
                          special_tokens=["<|endoftext|>"])
    tok.save(tmp_path / "t.json")
    again = loads((tmp_path / "t.json").read_text())
    assert again.pattern == PATTERNS["gpt4"] and again.to_json() == tok.to_json()
    assert again.encode(PROSE + "<|endoftext|>") == tok.encode(PROSE + "<|endoftext|>")


def test_gpt2_pattern_keeps_combining_marks_with_letters():
    decomposed = "cafe\u0301 na\u0308ive"
    assert split_text(compiled(PATTERNS["gpt2"]), decomposed) == ["cafe\u0301", " na\u0308ive"]
    assert split_text(compiled(PATTERNS["gpt2-exact"]), decomposed) == \
        ["cafe", "\u0301", " na", "\u0308", "ive"]
    assert split_text(compiled(PATTERNS["gpt4"]), "x 12345\n\nif") == \
        ["x", " ", "123", "45", "\n\n", "if"]


def test_custom_pattern_never_drops_text():
    tok = train_tokenizer("bpe", ["abc def"], vocab_size=270, pattern=r"[a-c]+")
    assert tok.decode(tok.encode("abc def!")) == "abc def!"


def test_parallel_encoding_equals_serial(code_text, bpe_tok, monkeypatch):
    import sheepop.tokenizers.bpe_train as bpe_train_module
    monkeypatch.setattr(bpe_train_module, "PARALLEL_MIN_CHARS", 4_000)
    monkeypatch.setattr("sheepop.tokenizers.bpe_count.COUNT_PARALLEL_MIN_CHARS", 4_000)
    text = code_text[:60_000]
    chunks = safe_chunks(text, 5_000)
    assert len(chunks) >= 4 and "".join(chunks) == text
    assert bpe_tok.encode_parallel(text, workers=2) == bpe_tok.encode(text)
    docs = [text[i:i + 3_000] for i in range(0, len(text), 3_000)]
    assert bpe_tok.encode_batch(docs, add_eos=True, workers=2) == \
        [bpe_tok.encode(d, add_eos=True) for d in docs]
    # Counting words in two processes gives the same counts as one.
    assert count_words([text], bpe_tok.pattern, ["<|eos|>"], workers=2) == \
        count_words([text], bpe_tok.pattern, ["<|eos|>"], workers=1)


def test_hf_backend_writes_the_same_file_format(code_text):
    tok = train_tokenizer("bpe", [code_text[:40_000]], vocab_size=500, backend="hf")
    assert isinstance(tok, BPETokenizer) and tok.vocab_size == 500
    assert all(tok.tokens[i] == bytes([i]) for i in range(256))
    again = loads(tok.to_json())
    assert again.encode(PROSE) == tok.encode(PROSE) and tok.decode(tok.encode(PROSE)) == PROSE
    ours = train_tokenizer("bpe", [code_text[:40_000]], vocab_size=500)
    # Both learn most of the same merges (their tie-breaks differ).
    shared = set(tok.tokens[256:356]) & set(ours.tokens[256:356])
    assert len(shared) >= 90
