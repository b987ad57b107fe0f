"""GGUF vocabularies: gguf_vocab then tokenizer_from_gguf gives the same ids; the real SmolLM2
metadata gives the ids of SmolLM2's own tokenizer (Digits + ByteLevel, built with `tokenizers`)
and of transformers' GGUF loader."""

from __future__ import annotations

import json

import pytest
from hf_vocabularies import BROAD_TEXT, smollm_style
from tok_samples import PROSE
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from sheepop.errors import UserError
from sheepop.tokenizers import loads, train_tokenizer
from sheepop.tokenizers.gguf_vocab import gguf_vocab, tokenizer_from_gguf
from sheepop.tokenizers.pretokenize import PATTERNS
from sheepop.tokenizers.pretrained.tokenizer import PretrainedTokenizer

NO_MARKS = "".join(c for c in BROAD_TEXT if c not in "\u0301\u0308")  # see _bpe_vocab


def test_round_trip_of_a_pretrained_smollm_vocabulary():
    ref = smollm_style([PROSE, BROAD_TEXT[:200]])
    tok = PretrainedTokenizer(json.loads(ref.to_str()),
                              {"bos": "<|im_start|>", "eos": "<|im_end|>"})
    tok.chat_template = "{{ messages }}"
    meta = gguf_vocab(tok)
    assert meta["tokenizer.ggml.pre"] == "smollm"
    assert meta["tokenizer.ggml.token_type"][:3] == [3, 3, 3]
    back = tokenizer_from_gguf(meta, "test.gguf")
    assert back.encode(BROAD_TEXT) == tok.encode(BROAD_TEXT) == ref.encode(BROAD_TEXT).ids
    assert (back.bos_id, back.eos_id, back.chat_template) == (1, 2, "{{ messages }}")
    assert gguf_vocab(loads(back.to_json())) == meta


def test_round_trip_of_a_sheepop_bpe():
    tok = train_tokenizer("bpe", [PROSE], vocab_size=400, pattern="gpt2-exact")
    back = tokenizer_from_gguf(gguf_vocab(tok), "test.gguf")
    assert back.encode(NO_MARKS) == tok.encode(NO_MARKS)
    assert back.encode("<|eos|>x") == tok.encode("<|eos|>x")
    assert (back.bos_id, back.eos_id, back.pad_id) == (tok.bos_id, tok.eos_id, tok.pad_id)


# Text with no mark or emoji, so a bpe trained on it has no token that joins a combining mark
# to anything; the texts encoded put marks next to letters, symbols, spaces and other marks.
PLAIN = PROSE.split("\n")[0] * 4 + " Zürich crème brûlée 3.14 'no' \n\t x  y"
MARKED = ("e\u0301crit cafe\u0301 nai\u0308ve !\u0301! \u0301a x\u0301\u0302y 9\u0301 "
          "'\u0301s the e\u0301 ")


@pytest.mark.parametrize("pattern, name", [("gpt2-exact", "gpt-2"), ("gpt2", "gpt-2"),
                                           ("gpt4", "llama-bpe")])
def test_a_sheepop_bpe_is_written_under_the_llama_cpp_name_of_its_split(pattern, name):
    """llama.cpp (src/llama-vocab.cpp) knows "gpt-2" and "llama-bpe", not "gpt2"; sheepop's gpt2
    and gpt4 count combining marks as letters, which no llama.cpp rule does, and differ from
    "gpt-2" / "llama-bpe" only at a mark's edges: a vocabulary with no token across one gives
    the same ids on text full of marks as the named rule (what the file read back applies)."""
    tok = train_tokenizer("bpe", [PLAIN], vocab_size=330, pattern=pattern)
    meta = gguf_vocab(tok)
    assert meta["tokenizer.ggml.pre"] == name
    back = tokenizer_from_gguf(meta, "test.gguf")
    for text in (PLAIN, MARKED, MARKED + PLAIN):
        assert back.encode(text) == tok.encode(text)
    assert sum(i >= 256 for i in set(tok.encode(MARKED + PLAIN))) > 20  # merges are used


@pytest.mark.parametrize("pattern", ["gpt2", "gpt4"])
def test_a_token_across_a_mark_has_no_llama_cpp_name(pattern):
    """sheepop's gpt2 learns "e" + U+0301 as one token, llama.cpp's gpt-2 never lets BPE see
    them together: refused, naming the token."""
    tok = train_tokenizer("bpe", ["e\u0301crit " * 50 + PLAIN], vocab_size=300,
                          pattern=pattern)
    with pytest.raises(UserError, match=r"token 259 \(b'e\\xcc'\) joins a combining mark to "
                                        r"another character.* --pattern gpt2-exact"):
        gguf_vocab(tok)
    ids = tok.encode("e\u0301crit")
    tok.pattern = PATTERNS["gpt2-exact"]  # what naming it "gpt-2" would have llama.cpp apply
    assert tokenizer_from_gguf(gguf_vocab(tok), "t.gguf").encode("e\u0301crit") != ids
    assert gguf_vocab(train_tokenizer("bpe", ["e\u0301crit " * 50 + PLAIN], vocab_size=300,
                                      pattern="gpt2-exact"))["tokenizer.ggml.pre"] == "gpt-2"


def test_llama_bpe_is_refused_when_a_token_is_not_its_own_bpe():
    """llama.cpp's llama-bpe takes a word that is a token whole (ignore_merges): "abc" would be
    one id there, two (ab, c) in sheepop, whose merges make ab before bc."""
    from sheepop.tokenizers.bpe import BPETokenizer
    merged = [(b"a", b"b"), (b"b", b"c"), (b"a", b"bc")]
    tok = BPETokenizer.from_merged_bytes(merged, ["<|eos|>"], "gpt4")
    assert len(tok.encode("abc")) == 2
    with pytest.raises(UserError, match=r"do not build token 258 \(b'abc'\) from its own bytes"):
        gguf_vocab(tok)
    assert gguf_vocab(BPETokenizer.from_merged_bytes(merged, ["<|eos|>"], "gpt2"))[
        "tokenizer.ggml.pre"] == "gpt-2"  # no ignore_merges there


def test_a_custom_split_has_no_llama_cpp_name():
    tok = train_tokenizer("bpe", [PLAIN], vocab_size=300, pattern=r"\w+|\s+|.")
    with pytest.raises(UserError, match=r"pattern \(custom: .*\) has no llama.cpp pre-tokenizer"):
        gguf_vocab(tok)


def test_files_sheepop_wrote_before_with_pre_gpt2_still_import():
    tok = train_tokenizer("bpe", [PLAIN], vocab_size=300, pattern="gpt2-exact")
    back = tokenizer_from_gguf({**gguf_vocab(tok), "tokenizer.ggml.pre": "gpt2"}, "old.gguf")
    assert back.encode(MARKED + PLAIN) == tok.encode(MARKED + PLAIN)


@pytest.mark.parametrize("change, message", [
    ({"tokenizer.ggml.model": "llama"}, "tokenizer.ggml.model 'llama' is not supported"),
    ({"tokenizer.ggml.pre": "jais-2"}, "tokenizer.ggml.pre 'jais-2' is not supported"),
    ({"tokenizer.ggml.precompiled_charsmap": [0]}, "precompiled_charsmap is not supported"),
    ({"tokenizer.ggml.add_space_prefix": True}, "add_space_prefix is true"),
])
def test_what_it_cannot_read_is_refused_by_name(change, message):
    meta = gguf_vocab(train_tokenizer("bpe", [PROSE[:300]], vocab_size=300,
                                      pattern="gpt2-exact"))
    with pytest.raises(UserError, match=message):
        tokenizer_from_gguf({**meta, **change}, "m.gguf")


def test_other_kinds_have_no_gguf_form():
    with pytest.raises(UserError, match="a char tokenizer has no GGUF form"):
        gguf_vocab(train_tokenizer("char", [PROSE[:300]]))


# ----- the real model ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def smollm2_meta(smollm2_gguf_path):
    import gguf
    reader = gguf.GGUFReader(smollm2_gguf_path)
    return {k: f.contents() for k, f in reader.fields.items() if k.startswith("tokenizer")}


@pytest.mark.real_model
def test_smollm2_gives_the_ids_of_its_own_tokenizer(smollm2_meta):
    tok = tokenizer_from_gguf(smollm2_meta, "SmolLM2.gguf")
    tokens = smollm2_meta["tokenizer.ggml.tokens"]
    types = smollm2_meta["tokenizer.ggml.token_type"]
    ref = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)},
                               merges=[tuple(m.split(" "))
                                       for m in smollm2_meta["tokenizer.ggml.merges"]]))
    ref.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    ref.decoder = decoders.ByteLevel()
    ref.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, k in zip(tokens, types) if k == 3])
    chat = "<|im_start|>user\nWhat is 2024+17?<|im_end|>\n<|im_start|>assistant\n"
    for text in (BROAD_TEXT, PROSE, chat):
        ids = tok.encode(text)
        assert ids == ref.encode(text).ids
        assert tok.decode(ids) == ref.decode(ids, skip_special_tokens=False)
    # SmolLM2 has no token for byte 4: the word "\x04" between "a" and "b" gives no id
    assert tok.encode("a\x04b") == ref.encode("a\x04b").ids == tok.encode("a") + tok.encode("b")
    assert (tok.bos_id, tok.eos_id, tok.unk_id, tok.pad_id) == (1, 2, 0, 2)
    assert tok.special_affixes == ([], []) and tok.chat_template.startswith("{% for message")
    assert loads(tok.to_json()).encode(BROAD_TEXT) == tok.encode(BROAD_TEXT)


@pytest.mark.real_model
def test_smollm2_gives_the_ids_of_transformers_gguf_loader(smollm2_meta, smollm2_gguf_path):
    from transformers import AutoTokenizer
    hf = AutoTokenizer.from_pretrained(smollm2_gguf_path.parent,
                                       gguf_file=smollm2_gguf_path.name)
    tok = tokenizer_from_gguf(smollm2_meta, "SmolLM2.gguf")
    for text in ("The capital of France is", PROSE[:3000], "In 2024, 1234567 people came.",
                 "<|im_start|>user\nhi<|im_end|>\n", " é 😀 中文 \x04"):
        assert tok.encode_for_model(text) == hf(text)["input_ids"]
    assert (hf.bos_token_id, hf.eos_token_id, hf.pad_token_id) == \
        (tok.bos_id, tok.eos_id, tok.pad_id)


@pytest.mark.real_model
def test_smollm2_metadata_is_written_back_as_it_came(smollm2_meta):
    """Imported and exported again, SmolLM2's vocabulary keeps its llama.cpp name "smollm" and
    every tokenizer field of the file, value for value."""
    written = gguf_vocab(tokenizer_from_gguf(smollm2_meta, "SmolLM2.gguf"))
    assert written["tokenizer.ggml.pre"] == "smollm"
    for key, value in written.items():
        if key in smollm2_meta:
            assert value == smollm2_meta[key], key
    assert set(smollm2_meta) - set(written) <= {"tokenizer.ggml.add_space_prefix"}
