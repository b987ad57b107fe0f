"""sheepop's pretrained tokenizer against Hugging Face `tokenizers`, on vocabularies of the
shapes real models use (tests/helpers/hf_vocabularies.py): the same ids, the same decoded text,
and a refusal by name of what it does not read."""

from __future__ import annotations

import json

import pytest
from hf_vocabularies import (
    BROAD_TEXT,
    gpt2_style,
    llama3_style,
    sentencepiece_style,
    smollm_style,
    spaced_merges_style,
)
from tok_samples import PROSE
from tokenizers import AddedToken, Regex, Tokenizer, models, normalizers, pre_tokenizers

from sheepop.errors import UserError
from sheepop.tokenizers import loads
from sheepop.tokenizers.pretrained.pre_tokenizers import split_by
from sheepop.tokenizers.pretrained.tokenizer import PretrainedTokenizer
from sheepop.tokenizers.streaming import decode_stream

CORPUS = [PROSE, BROAD_TEXT[:200]]
BUILDERS = {"gpt2": gpt2_style, "llama3": llama3_style, "smollm": smollm_style,
            "sentencepiece": sentencepiece_style, "spaced_merges": spaced_merges_style}
TEXTS = [BROAD_TEXT, PROSE[:2000], "", " ", "  leading", "<s>Hello</s> x <|endoftext|>y",
         "<|im_start|>user\n2024<|im_end|>\n"]


@pytest.fixture(scope="module", params=list(BUILDERS))
def pair(request) -> tuple[Tokenizer, PretrainedTokenizer]:
    ref = BUILDERS[request.param](CORPUS)
    return ref, PretrainedTokenizer(json.loads(ref.to_str()))


@pytest.mark.parametrize("text", TEXTS)
def test_ids_and_text_equal_tokenizers(pair, text):
    ref, tok = pair
    raw = ref.encode(text, add_special_tokens=False).ids
    assert tok.encode(text) == raw
    assert tok.encode_for_model(text) == ref.encode(text).ids  # the post-processor's BOS too
    for skip in (False, True):
        assert tok.decode(raw, skip_special=skip) == ref.decode(raw, skip_special_tokens=skip)
    assert "".join(decode_stream(tok, raw)) == tok.decode(raw)


def test_decode_of_encode_is_the_text(pair):
    ref, tok = pair
    if ref.get_vocab().get("[UNK]") is not None:
        # A vocabulary that does not cover every character: its [UNK] stands for them, so the
        # text cannot come back; it loses exactly what tokenizers loses.
        back = tok.decode(tok.encode(BROAD_TEXT))
        assert back != BROAD_TEXT
        assert back == ref.decode(ref.encode(BROAD_TEXT).ids, skip_special_tokens=False)
        return
    assert tok.decode(tok.encode(BROAD_TEXT)) == BROAD_TEXT


def test_the_file_round_trip_and_export(pair):
    ref, tok = pair
    back = loads(tok.to_json())
    assert back.kind == "pretrained" and back.encode(BROAD_TEXT) == tok.encode(BROAD_TEXT)
    again = Tokenizer.from_str(json.dumps(back.to_hf_dict()))
    assert again.encode(BROAD_TEXT).ids == ref.encode(BROAD_TEXT).ids


def test_added_special_tokens_take_new_ids_and_export(pair):
    _, tok = pair
    grown = tok.with_special_tokens(["<|user|>", "<|end|>"])
    assert grown.special_tokens["<|user|>"] == tok.vocab_size
    assert grown.vocab_size == tok.vocab_size + 2
    text = "<|user|>hi there<|end|>"
    assert grown.encode(text) == [tok.vocab_size, *tok.encode("hi there"), tok.vocab_size + 1]
    ref = Tokenizer.from_str(json.dumps(grown.to_hf_dict()))
    assert ref.encode(text, add_special_tokens=False).ids == grown.encode(text)


def _bpe_json(vocab, merges, **model) -> dict:
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, **model))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return json.loads(tok.to_str())


def test_ignore_merges_changes_ids_as_in_tokenizers():
    # (b, c) ranks first, so "abc" becomes a + bc; with ignore_merges, the word is one token.
    vocab = {"a": 0, "b": 1, "c": 2, "ab": 3, "bc": 4, "abc": 5}
    merges = [("b", "c"), ("a", "b")]
    for ignore in (False, True):
        tj = _bpe_json(vocab, merges, ignore_merges=ignore)
        ref = Tokenizer.from_str(json.dumps(tj))
        assert PretrainedTokenizer(tj).encode("abc ab") == ref.encode("abc ab").ids \
            == ([5, 3] if ignore else [0, 4, 3])


def test_a_byte_the_vocabulary_lacks_is_dropped_or_unknown_as_in_tokenizers():
    ref = gpt2_style([PROSE])
    tj = json.loads(ref.to_str())
    for lacking in ("Ą", "Ć"):  # the printable names of bytes 4 and 6
        del tj["model"]["vocab"][lacking]
    tj["model"]["merges"] = [m for m in tj["model"]["merges"] if "Ą" not in "".join(m)
                             and "Ć" not in "".join(m)]
    for unk in (None, "<|endoftext|>"):
        for fuse in (False, True):
            tj["model"].update(unk_token=unk, fuse_unk=fuse)
            ref = Tokenizer.from_str(json.dumps(tj))
            text = "a\x04\x04b \x06c\x04"
            ids = PretrainedTokenizer(tj).encode(text)
            assert ids == ref.encode(text).ids
    assert len(PretrainedTokenizer(tj).encode("\x04")) == 1  # fused into one unknown


def test_added_token_flags_as_in_tokenizers():
    ref = gpt2_style([PROSE])
    ref.normalizer = normalizers.Lowercase()
    ref.add_tokens([AddedToken("mask", single_word=True, lstrip=True, rstrip=True,
                               normalized=True),
                    AddedToken("<Sep>", lstrip=True, normalized=False, special=True),
                    AddedToken("fox", rstrip=True, normalized=True)])
    tok = PretrainedTokenizer(json.loads(ref.to_str()))
    for text in ["A MASK here, unmasked Mask   x <Sep>  <sep> FOX  jumps", "mask", "Xmask"]:
        assert tok.encode(text) == ref.encode(text).ids


BEHAVIORS = ["Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"]


@pytest.mark.parametrize("behavior", BEHAVIORS)
@pytest.mark.parametrize("invert", [False, True])
def test_split_behaviours_as_in_tokenizers(behavior, invert):
    import regex
    snake = "".join(f"_{c.lower()}" if c.isupper() else c for c in behavior)[1:]
    ref = pre_tokenizers.Split(Regex(r"\d|ab"), snake, invert=invert)
    for text in ["ab12c3 d44ab", "xxababyab", "", "9"]:
        expected = [w for w, _ in ref.pre_tokenize_str(text)]
        assert split_by(regex.compile(r"\d|ab"), behavior, invert, text)[0] == expected


@pytest.mark.parametrize("scheme", ["always", "first", "never"])
@pytest.mark.parametrize("split", [True, False])
def test_metaspace_as_in_tokenizers(scheme, split):
    ref = sentencepiece_style([PROSE])
    tj = json.loads(ref.to_str())
    tj["normalizer"] = None
    tj["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": scheme,
                           "split": split}
    tj["decoder"] = dict(tj["pre_tokenizer"])
    ref = Tokenizer.from_str(json.dumps(tj))
    tok = PretrainedTokenizer(tj)
    for text in ["Hey  you ▁x", " lead", "a<s>b c", "<s> x"]:
        ids = ref.encode(text, add_special_tokens=False).ids
        assert tok.encode(text) == ids
        assert tok.decode(ids) == ref.decode(ids, skip_special_tokens=False)


@pytest.mark.parametrize("change, message", [
    (lambda tj: tj["model"].update(type="Unigram"), "BPE models only"),
    (lambda tj: tj["model"].update(dropout=0.1), "'dropout' = 0.1 is not supported"),
    (lambda tj: tj["model"].update(novel=1), "unknown field 'novel'"),
    (lambda tj: tj.update(truncation={"max_length": 8}), "'truncation' is set"),
    (lambda tj: tj.update(pre_tokenizer={"type": "UnicodeScripts"}),
     "pre_tokenizer (UnicodeScripts): this pre-tokenizer is not supported"),
    (lambda tj: tj.update(normalizer={"type": "Precompiled", "precompiled_charsmap": ""}),
     "normalizer (Precompiled): this normalizer is not supported"),
    (lambda tj: tj.update(decoder={"type": "WordPiece"}), "decoder (WordPiece)"),
    (lambda tj: tj["model"]["merges"].append("a  b"), "must be \"left right\" (one space)"),
])
def test_what_it_cannot_honour_is_refused_by_name(change, message):
    tj = json.loads(gpt2_style([PROSE[:500]]).to_str())
    change(tj)
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        PretrainedTokenizer(tj)


def test_the_model_s_own_special_tokens_and_bos_rule():
    tj = json.loads(sentencepiece_style([PROSE]).to_str())
    tok = PretrainedTokenizer(tj, {"bos": "<s>", "eos": "</s>"})
    assert (tok.bos_id, tok.eos_id, tok.unk_id, tok.pad_id) == (1, 2, 0, None)
    assert tok.special_affixes == ([1], [])  # the post-processor's
    assert tok.encode("hi", add_eos=True)[-1] == 2
    # tokenizer_config.json's add_bos_token / add_eos_token decide alone (transformers' rule)
    tok = PretrainedTokenizer(tj, {"bos": "<s>", "eos": "</s>"}, False, True)
    assert tok.encode_for_model("hi") == [*tok.encode("hi"), 2]
    with pytest.raises(UserError, match="has no BOS token"):
        PretrainedTokenizer(tj).encode("hi", add_bos=True)
    with pytest.raises(UserError, match="not trained"):
        PretrainedTokenizer.train(["x"], 10)
