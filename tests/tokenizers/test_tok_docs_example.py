"""The worked example of docs/tokenizers.md: every number in it, recomputed from the code."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from sheepop.tokenizers import train_tokenizer
from sheepop.tokenizers.bpe_train import count_words, initial_words, merge_word
from sheepop.tokenizers.pretokenize import PATTERNS

CORPUS = ("low low low low low lower lower newest newest newest newest newest newest "
          "widest widest widest")
DOC = (Path(__file__).parents[2] / "docs" / "tokenizers.md").read_text(encoding="utf-8")


def test_word_counts():
    counts = count_words([CORPUS], PATTERNS["gpt2"], [])
    assert counts == {" newest": 6, " low": 4, " widest": 3, " lower": 2, "low": 1}
    assert "| count | 6 | 4 | 3 | 2 | 1 |" in DOC
    assert CORPUS in DOC


def test_merge_table():
    tok = train_tokenizer("bpe", [CORPUS], vocab_size=265, special_tokens=["<|eos|>"])
    assert tok.vocab_size == 265 and tok.special_tokens == {"<|eos|>": 264}
    # Each merge's count at the moment it is made, by recounting (the naive way).
    words, weights = initial_words(count_words([CORPUS], PATTERNS["gpt2"], []).items())
    rows = []
    for rank, (a, b) in enumerate(tok.merges):
        pairs: Counter = Counter()
        for w, n in zip(words, weights):
            for pair in zip(w, w[1:]):
                pairs[pair] += n
        new = 256 + rank
        rows.append(f"| {rank} | {new} | `{tok.id_to_token(a)}` + `{tok.id_to_token(b)}` "
                    f"| {pairs[(a, b)]} |")
        words = [merge_word(w, a, b, new) for w in words]
    assert rows == [
        "| 0 | 256 | `e` + `s` | 9 |",
        "| 1 | 257 | `es` + `t` | 9 |",
        "| 2 | 258 | `l` + `o` | 7 |",
        "| 3 | 259 | `lo` + `w` | 7 |",
        "| 4 | 260 | `Ġ` + `low` | 6 |",
        "| 5 | 261 | `Ġ` + `n` | 6 |",
        "| 6 | 262 | `Ġn` + `e` | 6 |",
        "| 7 | 263 | `Ġne` + `w` | 6 |",
    ]
    for row in rows:
        assert row in DOC, row


def test_encodings():
    tok = train_tokenizer("bpe", [CORPUS], vocab_size=265, special_tokens=["<|eos|>"])
    assert tok.encode("lowest") == [259, 257]
    assert tok.encode(" newer") == [263, 101, 114]
    assert tok.encode(" lowest<|eos|>") == [260, 257, 264]
    for ids in ("**`[259, 257]`**", "**`[263, 101, 114]`**", "**`[260, 257, 264]`**"):
        assert ids in DOC
