"""BPE training streamed: counting words piece by piece, in two processes, from a file read in
blocks, gives exactly the counts and merges of splitting the whole text at once."""

from __future__ import annotations

import argparse
import random
from collections import Counter

import pytest
from tok_samples import PROSE, VARIED

import sheepop.tokenizers.bpe_count as bpe_count
import sheepop.tokenizers.bpe_train as bpe_train
from sheepop.cli import tokenizer as cli
from sheepop.tokenizers import load
from sheepop.tokenizers.pretokenize import (
    _SAFE_CUT,
    PATTERNS,
    compiled,
    cuts_safely,
    rejoin_at_safe_cuts,
    split_text,
)
from sheepop.tokenizers.special_matcher import SpecialMatcher

SPECIALS = ["<|bos|>", "<|eos|>", "<|pad|>"]


@pytest.fixture(scope="module")
def tricky(code_text) -> str:
    """Code, prose and unicode with whitespace runs, CRLF, tabs, decomposed accents, emoji,
    CJK, special tokens and many safe points (a newline between two non-spaces)."""
    rnd = random.Random(7)
    bits = [code_text[:20_000], PROSE, *VARIED, "x\ny\nz\n", "a  \n\n  b\r\n\tc",
            "cafe\u0301 na\u0308ive\n😀😀 日本語\n", "<|eos|>", "end<|bos|>\nstart", "   \n",
            "don't\nWE'LL\n", "1234567\n890\n"]
    parts = [rnd.choice(bits) for _ in range(300)]
    return "".join(parts) + code_text[20_000:40_000]


def one_shot_counts(text: str, pattern: str, specials: list[str]) -> Counter[str]:
    """The reference: special tokens cut out, then each whole segment split at once."""
    regex_ = compiled(pattern)
    words: Counter[str] = Counter()
    for piece, special in SpecialMatcher({t: i for i, t in enumerate(specials)}).split(text):
        if special is None:
            words.update(split_text(regex_, piece))
    return words


def byte_merges(counts: Counter[str], n_tokens: int) -> list[tuple[bytes, bytes]]:
    vocab = bpe_train._Vocab()
    merges = bpe_train.train_naive(counts.items(), n_tokens)
    for a, b in merges:
        vocab.join(a, b)
    return [(vocab.tokens[a], vocab.tokens[b]) for a, b in merges]


def random_blocks(text: str, rnd: random.Random, longest: int) -> list[str]:
    """`text` cut anywhere: inside words, whitespace runs, CRLF and special tokens."""
    blocks, i = [], 0
    while i < len(text):
        step = rnd.randint(1, longest)
        blocks.append(text[i:i + step])
        i += step
    return blocks


@pytest.fixture()
def small_pieces(monkeypatch):
    """Pieces of ~40 characters and jobs of ~300, so that thousands of borders fall inside
    the text; and two processes from 4,000 characters on."""
    monkeypatch.setattr(bpe_count, "PIECE_CHARS", 40)
    monkeypatch.setattr(bpe_count, "JOB_CHARS", 300)
    monkeypatch.setattr(bpe_count, "COUNT_PARALLEL_MIN_CHARS", 4_000)


@pytest.mark.parametrize("name", ["gpt2", "gpt4", "gpt2-exact"])
def test_streamed_counts_equal_one_shot(tricky, small_pieces, name):
    pattern = PATTERNS[name]
    reference = one_shot_counts(tricky, pattern, SPECIALS)
    assert bpe_count.count_words([tricky], pattern, SPECIALS) == reference
    blocks = random_blocks(tricky, random.Random(1), 500)
    assert bpe_count.count_words(rejoin_at_safe_cuts(blocks), pattern, SPECIALS) == reference


def test_two_processes_learn_the_one_shot_merges(tricky, small_pieces):
    pattern = PATTERNS["gpt2"]
    reference = byte_merges(one_shot_counts(tricky, pattern, SPECIALS), 256 + 120)
    blocks = rejoin_at_safe_cuts(random_blocks(tricky, random.Random(2), 3_000))
    merged = bpe_train.train_merges(blocks, 256 + 120 + len(SPECIALS), pattern, SPECIALS,
                                    workers=2)
    assert len(merged) == 120 and merged == reference


def test_custom_pattern_and_newline_specials_are_never_cut(small_pieces):
    text = "ab\ncd\nef\n" * 50
    assert not cuts_safely(r"[a-z]\n[a-z]|\S|\s")  # a custom word may cross a safe point
    assert not cuts_safely(PATTERNS["gpt2"], ["b\nc"])
    assert cuts_safely("gpt4", SPECIALS)
    pattern = r"[a-z]\n[a-z]|\S|\s"
    assert bpe_count.count_words([text], pattern, []) == one_shot_counts(text, pattern, [])
    assert bpe_count.count_words([text], PATTERNS["gpt2"], ["b\nc"]) == \
        one_shot_counts(text, PATTERNS["gpt2"], ["b\nc"])


def test_rejoined_pieces_cut_only_at_safe_points(tricky):
    rnd = random.Random(3)
    for longest in (1, 2, 7, 100, 5_000):
        blocks = random_blocks(tricky[:30_000], rnd, longest)
        pieces = list(rejoin_at_safe_cuts(blocks))
        assert "".join(pieces) == tricky[:30_000] and all(pieces)
        at = 0
        for piece in pieces[:-1]:
            at += len(piece)
            assert _SAFE_CUT.match(tricky, at)
    # Each piece runs to the last safe point seen so far; "c  \nd" has none.
    assert list(rejoin_at_safe_cuts(["a\n", "b\nc", "", "  \n", "d"])) == ["a\nb\n", "c  \nd"]
    assert list(rejoin_at_safe_cuts([])) == []


def test_cli_reads_a_large_file_in_pieces_and_trains_the_same(tricky, tmp_path, monkeypatch):
    """The command line reads 256K characters at a time: a 3-block file gives the tokenizer
    that training on the whole text in memory gives."""
    text = (tricky * 12)[:700_000]
    corpus, out = tmp_path / "corpus.txt", tmp_path / "tok.json"
    corpus.write_text(text, encoding="utf-8")
    parser = argparse.ArgumentParser(prog="sheepop")
    cli.register(parser.add_subparsers())
    args = parser.parse_args(["tokenizer", "train", str(corpus), "--kind", "bpe",
                              "--vocab-size", "300", "--out", str(out)])
    assert args.func(args) == 0
    merged = byte_merges(one_shot_counts(text, PATTERNS["gpt2"], SPECIALS), 256 + 41)
    assert [load(out).tokens[i] for i in range(256, 297)] == [a + b for a, b in merged]
