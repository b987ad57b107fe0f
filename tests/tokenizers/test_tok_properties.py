"""Property tests (hypothesis): round trips and agreement hold for any text, not just samples."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tok_samples import PROSE

from sheepop.tokenizers import IncrementalDecoder, decode_stream, train_tokenizer
from sheepop.tokenizers.bpe_train import train_fast, train_naive

# Any Unicode text (no lone surrogates: those are not text), plus the characters that the
# pre-split rules treat specially, so that short examples hit them often.
TRICKY = list(" \t\n\r\x0b\x0c\x1c\x1f\x85\u00a0\u2003\u2028\u3000\u200b\ufeff\u0301'sltdvemr9")
TEXT = st.text(alphabet=st.one_of(st.characters(codec="utf-8"), st.sampled_from(TRICKY)),
               max_size=60)
FAST = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def hf_pair(bpe_tok, tmp_path_factory):
    from tokenizers import Tokenizer as HFTokenizer

    from sheepop.tokenizers.hf import export_hf
    path = tmp_path_factory.mktemp("hf") / "tokenizer.json"
    export_hf(bpe_tok, path)
    return bpe_tok, HFTokenizer.from_file(str(path))


@FAST
@given(text=TEXT)
def test_bpe_round_trips_any_text(bpe_tok, text):
    ids = bpe_tok.encode(text)
    assert bpe_tok.decode(ids) == text
    assert "".join(decode_stream(bpe_tok, ids)) == text


@FAST
@given(text=TEXT)
def test_hf_export_agrees_on_any_text(hf_pair, text):
    tok, hf = hf_pair
    assert hf.encode(text).ids == tok.encode(text)


@FAST
@given(ids=st.lists(st.integers(0, 699), max_size=30))
def test_streamed_decode_equals_decode_for_any_ids(bpe_tok, ids):
    # Arbitrary ids make invalid UTF-8; streaming must still give exactly decode()'s text.
    dec = IncrementalDecoder(bpe_tok)
    assert "".join(dec.step(i) for i in ids) + dec.flush() == bpe_tok.decode(ids)


@FAST
@given(text=TEXT)
def test_char_round_trips_text_of_its_alphabet(text):
    tok = train_tokenizer("char", [text + "x"])
    assert tok.decode(tok.encode(text)) == text
    assert tok.count_unknown(text) == 0


@FAST
@given(text=st.text(alphabet=st.sampled_from(list("ab ,.!()\n'")), max_size=80))
def test_word_decode_then_encode_gives_the_same_ids(text):
    tok = train_tokenizer("word", [PROSE, "a b"])
    ids = tok.encode(text)
    assert tok.encode(tok.decode(ids)) == ids


@FAST
@given(text=st.text(alphabet=st.sampled_from(list("0123456789 ")), max_size=80))
def test_digits_round_trip(text):
    tok = train_tokenizer("digits", ["0"])
    assert tok.decode(tok.encode(text)) == text and max(tok.encode(text), default=0) <= 10


@settings(max_examples=60, deadline=None)
@given(words=st.dictionaries(st.text(alphabet="abcd ", min_size=1, max_size=8),
                             st.integers(1, 9), max_size=12))
def test_fast_trainer_equals_naive_on_any_word_counts(words):
    assert train_fast(words.items(), 300) == train_naive(words.items(), 300)
