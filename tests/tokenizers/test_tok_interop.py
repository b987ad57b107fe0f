"""Talking to the ecosystem: Hugging Face tokenizer.json export, GPT-2 vocab/merges import."""

from __future__ import annotations

import json

import pytest
from tok_samples import PROSE, VARIED
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers

from sheepop.errors import UserError
from sheepop.tokenizers import train_tokenizer
from sheepop.tokenizers.gpt2 import export_gpt2, import_gpt2
from sheepop.tokenizers.hf import export_hf
from sheepop.tokenizers.pretokenize import PATTERNS, bytes_to_unicode, token_to_str


@pytest.mark.parametrize("pattern", ["gpt2", "gpt4"])
def test_hf_from_file_gives_exactly_our_ids(code_text, tmp_path, pattern):
    tok = train_tokenizer("bpe", [code_text[:60_000], PROSE], vocab_size=800, pattern=pattern)
    export_hf(tok, tmp_path / "tokenizer.json")
    hf = HFTokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert hf.get_vocab_size() == tok.vocab_size
    for text in VARIED + [PROSE, code_text[60_000:70_000]]:
        ids = tok.encode(text)
        assert hf.encode(text).ids == ids, text[:40]
        assert hf.decode(ids, skip_special_tokens=False) == text
    assert hf.token_to_id("<|eos|>") == tok.eos_id


def test_export_of_a_kind_without_a_hugging_face_form_is_refused(tmp_path):
    with pytest.raises(UserError, match="a digits tokenizer has no Hugging Face form "
                                        r"\(these do: bpe, char, word\)"):
        export_hf(train_tokenizer("digits", ["1, 2, 3"]), tmp_path / "x.json")
    assert not (tmp_path / "x.json").exists()


def _gpt2_style_files(tok, folder):
    """Write `tok` as GPT-2 does: its 256 byte tokens first in bytes_to_unicode order (so id k
    is *not* byte k), then the merged tokens in rank order, then <|endoftext|> last."""
    table = bytes_to_unicode()
    names = [table[b] for b in sorted(table, key=lambda b: (ord(table[b]) >= 256, b))]
    names += [token_to_str(tok.tokens[i]) for i in range(256, len(tok.tokens))
              if tok.tokens[i] is not None]
    vocab = {name: i for i, name in enumerate(names)}
    vocab["<|endoftext|>"] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    merges = [f"{token_to_str(tok.tokens[a])} {token_to_str(tok.tokens[b])}"
              for a, b in tok.merges]
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n",
                                       encoding="utf-8")
    return vocab


def test_gpt2_import_matches_hugging_face_gpt2_tokenizer(code_text, tmp_path):
    source = train_tokenizer("bpe", [code_text[:60_000], PROSE], vocab_size=700,
                             pattern="gpt2-exact", special_tokens=["<|endoftext|>"])
    vocab = _gpt2_style_files(source, tmp_path)
    tok = import_gpt2(tmp_path / "vocab.json", tmp_path / "merges.txt")
    assert tok.vocab_size == len(vocab) and tok.special_tokens == {"<|endoftext|>": 699}
    assert tok.pattern == PATTERNS["gpt2-exact"]
    assert tok.id_to_token(0) == "!" and tok.token_to_id("Ġ") == 220  # GPT-2's own ids
    # The reference: HF's BPE model read from the same two files, with GPT-2's byte-level
    # pre-tokenizer (which has OpenAI's pattern built in).
    hf = HFTokenizer(models.BPE.from_file(str(tmp_path / "vocab.json"),
                                          str(tmp_path / "merges.txt")))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.add_special_tokens(["<|endoftext|>"])
    for text in VARIED[:6] + [PROSE, "a<|endoftext|>b"]:
        ids = tok.encode(text)
        assert ids == hf.encode(text).ids, text[:40]
        assert tok.decode(ids) == text
        # Same tokens as the tokenizer the files came from, under GPT-2's ids.
        assert [tok.id_to_token(i) for i in ids] == \
            [source.id_to_token(i) for i in source.encode(text)]


def test_gpt2_export_import_round_trip(tmp_path):
    tok = train_tokenizer("bpe", [PROSE * 4], vocab_size=320)
    export_gpt2(tok, tmp_path / "vocab.json", tmp_path / "merges.txt")
    again = import_gpt2(tmp_path / "vocab.json", tmp_path / "merges.txt",
                        special_tokens=list(tok.special_tokens), pattern="gpt2")
    assert again.to_json() == tok.to_json()


def test_gpt2_import_errors(tmp_path):
    (tmp_path / "merges.txt").write_text("#version: 0.2\n", encoding="utf-8")
    (tmp_path / "vocab.json").write_text('{"a": 0, "b": 2}', encoding="utf-8")
    with pytest.raises(UserError, match="ids must be exactly"):
        import_gpt2(tmp_path / "vocab.json", tmp_path / "merges.txt")
    (tmp_path / "vocab.json").write_text('{"a": 0, "b": 1}', encoding="utf-8")
    with pytest.raises(UserError, match="byte 0 is missing"):
        import_gpt2(tmp_path / "vocab.json", tmp_path / "merges.txt")
    with pytest.raises(UserError, match="not found"):
        import_gpt2(tmp_path / "nope.json", tmp_path / "merges.txt")
    table = bytes_to_unicode()
    vocab = {table[b]: b for b in range(256)}
    (tmp_path / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (tmp_path / "merges.txt").write_text("#version: 0.2\na b c\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"merges.txt:2: a merge line must be two tokens"):
        import_gpt2(tmp_path / "vocab.json", tmp_path / "merges.txt")
    (tmp_path / "merges.txt").write_text("a b\n", encoding="utf-8")
    with pytest.raises(UserError, match="merge 1 .* does not join"):
        import_gpt2(tmp_path / "vocab.json", tmp_path / "merges.txt")
