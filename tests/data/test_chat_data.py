"""Conversations files: both forms read, every bad line skipped with its line number, the
context limit at its exact boundary, and padded batches."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from sheepop.arch import IGNORE_INDEX, PAD_ID
from sheepop.data import conversations as chat_data
from sheepop.data.conversations import chat_batches, pad_examples, read_conversations
from sheepop.errors import UserError
from sheepop.tokenizers import train_tokenizer
from sheepop.tokenizers.chat_format import encode_chat, with_chat_tokens


@pytest.fixture(scope="module")
def tok():
    # char ids: specials 0-3, "\n" 4, "a" 5, "b" 6, "c" 7; <|system|> 8 ... <|end|> 11
    return with_chat_tokens(train_tokenizer("char", ["abc\n"]))[0]


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


GOOD = [[user("ab"), assistant("c")],
        [{"role": "system", "content": "c"}, user("a"), assistant("b"), user("c"),
         assistant("ab")]]
LINES = [
    json.dumps({"messages": GOOD[0]}),                          # 1
    "{not json",                                                # 2
    "",                                                         # 3 (blank: not counted)
    json.dumps({"prompt": "ab", "completion": "c"}),            # 4 = GOOD[0]
    "[1, 2]",                                                   # 5
    json.dumps({"messages": [{"role": "bot", "content": "a"}]}),   # 6
    json.dumps({"messages": [{"role": "user"}]}),               # 7
    json.dumps({"messages": [user("a"), assistant(7)]}),        # 8
    json.dumps({"messages": []}),                               # 9
    json.dumps({"messages": [user("a")]}),                      # 10
    json.dumps({"prompt": "a"}),                                # 11
    json.dumps({"text": "a"}),                                  # 12
    json.dumps({"messages": [user("a<|end|>"), assistant("b")]}),  # 13
    json.dumps({"messages": [user("a" * 40), assistant("b")]}),    # 14: too long
    json.dumps({"messages": GOOD[1]}),                          # 15
    json.dumps({"messages": [user("a"), {"role": "system", "content": "c"}]}),  # 16
    b"\xff\xfe not utf-8",                                      # 17
]


def write_lines(path, lines):
    path.write_bytes(b"\n".join(x if isinstance(x, bytes) else x.encode() for x in lines)
                     + b"\n")
    return path


def test_every_line_is_used_or_skipped_with_its_number_and_reason(tok, tmp_path):
    path = write_lines(tmp_path / "c.jsonl", LINES)
    data = read_conversations(path, tok, block_size=32)
    expected = [encode_chat(tok, m) for m in (GOOD[0], GOOD[0], GOOD[1])]
    assert len(data.examples) == 3
    for (x, y), (ex, ey) in zip(data.examples, expected, strict=True):
        assert x.tolist() == ex.tolist() and y.tolist() == ey.tolist()
    assert data.lines == 16
    assert data.skipped == [
        (2, "not valid JSON"), (5, "not a JSON object"), (6, "message 1: unknown role 'bot'"),
        (7, "message 1: no content"), (8, "message 2: non-string content"),
        (9, "empty conversation"), (10, "no assistant turn to learn from"),
        (11, "'completion' missing"),
        (12, "neither 'messages' nor 'prompt' and 'completion'"),
        (13, "message 1 holds the special token <|end|>, which a message cannot contain"),
        (14, "does not fit the context of 32 tokens"),
        (16, "message 2: a system message after the first message"),
        (17, "not valid JSON")]
    report = data.report()
    assert report[0] == f"conversations: 3 of 16 lines of {path} (13 skipped)"
    assert report[1] == "  skipped: not valid JSON: lines 2, 17"
    assert report[2] == "  skipped: not a JSON object: line 5"
    assert len(report) == 13
    # train_on="all": a conversation without an assistant turn still teaches something
    everything = read_conversations(path, tok, block_size=32, train_on="all")
    assert len(everything.examples) == 4 and (10, "no assistant turn to learn from") \
        not in everything.skipped
    assert everything.examples[0][1].tolist() == encode_chat(tok, GOOD[0], train_on="all")[1] \
        .tolist()


def test_the_context_limit_is_exact(tok, tmp_path):
    # [user "a"*k, assistant "b"]: (4 + k) + 5 = k + 9 ids, so k + 8 positions.
    lines = [json.dumps({"prompt": "a" * k, "completion": "b"}) for k in (23, 24, 25)]
    data = read_conversations(write_lines(tmp_path / "c.jsonl", lines), tok, block_size=32)
    assert [len(x) for x, _ in data.examples] == [31, 32]
    assert data.skipped == [(3, "does not fit the context of 32 tokens")]


def test_no_usable_line_is_an_error_naming_the_counts(tok, tmp_path):
    path = write_lines(tmp_path / "c.jsonl", ["{", "[]", "{", json.dumps({"prompt": "a"})])
    with pytest.raises(UserError) as e:
        read_conversations(path, tok, 32)
    assert str(e.value) == (f"{path}: no usable conversation in 4 lines (not valid JSON (2); "
                            "not a JSON object (1); 'completion' missing (1))")
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(UserError, match=r"no usable conversation in 0 lines$"):
        read_conversations(tmp_path / "empty.jsonl", tok, 32)
    with pytest.raises(UserError, match="conversations file not found"):
        read_conversations(tmp_path / "missing.jsonl", tok, 32)
    with pytest.raises(UserError, match="is a directory"):
        read_conversations(tmp_path, tok, 32)
    (tmp_path / "c.jsonl.gz").write_bytes(gzip.compress(b'{"prompt": "a"}\n'))
    with pytest.raises(UserError, match="is compressed: decompress it"):
        read_conversations(tmp_path / "c.jsonl.gz", tok, 32)
    plain = train_tokenizer("char", ["abc\n"])
    with pytest.raises(UserError, match="the tokenizer has no chat template"):
        read_conversations(path, plain, 32)


def test_a_line_past_the_size_limit_is_skipped_unread(tok, tmp_path, monkeypatch):
    monkeypatch.setattr(chat_data, "MAX_LINE_BYTES", 64)
    long = json.dumps({"prompt": "a" * 200, "completion": "b"})
    path = write_lines(tmp_path / "c.jsonl", [long, json.dumps({"prompt": "a",
                                                                "completion": "b"})])
    data = read_conversations(path, tok, 512)
    assert data.skipped == [(1, "longer than 64 bytes")]
    assert len(data.examples) == 1 and data.lines == 2


def test_padded_batches(tok):
    a = (np.array([9, 4, 5]), np.array([-1, 6, 11]))
    b = (np.array([9, 4, 5, 6, 7]), np.array([-1, -1, 6, 7, 11]))
    x, y = pad_examples([a, b])
    assert x.tolist() == [[9, 4, 5, PAD_ID, PAD_ID], [9, 4, 5, 6, 7]]
    assert y.tolist() == [[-1, 6, 11, IGNORE_INDEX, IGNORE_INDEX], [-1, -1, 6, 7, 11]]
    x, y = pad_examples([a], length=4, pad_id=2)
    assert x.tolist() == [[9, 4, 5, 2]] and y.tolist() == [[-1, 6, 11, -1]]
    with pytest.raises(ValueError, match="does not fit 2"):
        pad_examples([a], length=2)
    examples = [(np.arange(k + 1), np.arange(k + 1)) for k in range(7)]
    batches = list(chat_batches(examples, 3, np.random.default_rng(0)))
    assert [bx.shape[0] for bx, _ in batches] == [3, 3, 1]
    order = np.random.default_rng(0).permutation(7)
    seen = [int(row[: np.flatnonzero(yrow != IGNORE_INDEX).max() + 1].max())
            for bx, by in batches for row, yrow in zip(bx, by, strict=True)]
    assert seen == order.tolist()  # every example once, in the permutation's order
    assert all(bx.shape[1] == max(order[3 * i: 3 * i + 3]) + 1
               for i, (bx, _) in enumerate(batches))
