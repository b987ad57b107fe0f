"""The fast pre-split: each named pattern's `re` twin splits ASCII exactly as the pattern does,
and `split_text` gives the words of `regex` on the whole text for any text."""

from __future__ import annotations

import itertools
import re

import pytest
import regex
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sheepop.tokenizers.pretokenize import (
    ASCII_PATTERNS,
    MIXED_PIECE_CHARS,
    PATTERNS,
    WHITESPACE,
    ascii_twin,
    compiled,
    iter_safe_chunks,
    split_text,
)

ASCII = [chr(c) for c in range(128)]
# The characters the rules treat specially, so that short random texts hit them often.
TRICKY_ASCII = list(" \t\n\r\x0b\x0c\x1c\x1f'sSltTdDvVeEmMrR09aZ_.-!")
FAST = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))


def test_every_named_pattern_has_an_ascii_twin_and_custom_ones_none():
    assert set(ASCII_PATTERNS) == set(PATTERNS)
    assert ascii_twin(r"\w+|\W") is None


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_twin_splits_every_ascii_pair_as_the_pattern(name):
    pattern, twin = compiled(PATTERNS[name]), ascii_twin(PATTERNS[name])
    for a, b in itertools.product(ASCII, repeat=2):
        assert twin.findall(a + b) == pattern.findall(a + b), (name, a + b)


@pytest.mark.parametrize("name", sorted(PATTERNS))
@FAST
@given(text=st.text(alphabet=st.one_of(st.sampled_from(ASCII), st.sampled_from(TRICKY_ASCII)),
                    max_size=40))
def test_twin_splits_random_ascii_as_the_pattern(name, text):
    assert ascii_twin(PATTERNS[name]).findall(text) == compiled(PATTERNS[name]).findall(text)


LINE = st.text(alphabet=st.one_of(st.sampled_from(TRICKY_ASCII), st.characters(codec="utf-8"),
                                  st.sampled_from(list("é\u0301\u00a0\u3000\u2028"))),
               max_size=80)


@pytest.mark.parametrize("name", sorted(PATTERNS))
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(lines=st.lists(LINE, min_size=1, max_size=60))
def test_split_text_of_long_mixed_text_equals_the_pattern_on_the_whole(name, lines):
    # Long texts go through safe pieces, ASCII ones through the twin, the rest through regex.
    text = "\n".join(lines) * max(1, 2 * MIXED_PIECE_CHARS // (sum(map(len, lines)) + 1))
    pattern = compiled(PATTERNS[name])
    assert split_text(pattern, text) == pattern.findall(text)


def test_custom_pattern_keeps_unmatched_text_as_words():
    assert split_text(regex.compile(r"[a-z]+"), "ab, cd!") == ["ab", ", ", "cd", "!"]


def test_whitespace_class_is_regex_s_on_every_code_point():
    everything = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000)
    assert re.findall(f"[{WHITESPACE}]", everything) == regex.findall(r"\s", everything)


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(lines=st.lists(LINE, min_size=1, max_size=40), target=st.integers(1, 200))
def test_safe_chunks_cut_where_the_regex_rule_says(lines, target):
    # The cut finder runs on `re`; the rule it implements is (?<=\S\n)(?=\S) in `regex`.
    text = "\n".join(lines)
    rule, expected, start = regex.compile(r"(?<=\S\n)(?=\S)"), [], 0
    while len(text) - start > target and (m := rule.search(text, start + target)):
        expected.append(text[start:m.start()])
        start = m.start()
    assert list(iter_safe_chunks(text, target)) == [*expected, text[start:]]


def test_dense_non_ascii_text_is_split_whole_and_the_same():
    text = "\n".join(["Привет, мир! 你好 2024", "    def f(x): return x"] * 400)
    pattern = compiled(PATTERNS["gpt2"])
    assert split_text(pattern, text) == pattern.findall(text)
