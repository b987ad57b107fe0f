"""Shared fixtures: small corpora and trained tokenizers, built once per test session."""

from __future__ import annotations

import inspect
import json

import pytest
from tok_samples import PROSE

from sheepop.tokenizers import train_tokenizer


@pytest.fixture(scope="session")
def code_text() -> str:
    """About 150 KB of real Python source (the standard library's json and inspect modules)."""
    return "".join(open(m.__file__, encoding="utf-8").read() for m in (json, inspect))[:150_000]


@pytest.fixture(scope="session")
def bpe_tok(code_text):
    return train_tokenizer("bpe", [code_text, PROSE], vocab_size=700)
