"""Verifiers and prompts of `sheepop rl` (sheepop.rl.verifiers, sheepop.rl.tasks): each built-in
verifier on answers a small model writes, a user's own function, the built-in tasks' records and
the refusals, one line each."""

from __future__ import annotations

import sys

import pytest

from sheepop.errors import UserError
from sheepop.rl import tasks
from sheepop.rl.verifiers import last_integer, resolve


@pytest.mark.parametrize("answer, reward", [
    ("1 + 2 = 3 in mathematics.", 1.0),   # SmolLM2 restates the question: the last one counts
    ("3", 1.0), ("The answer is 3.", 1.0), ("3 + 0 = 3", 1.0),
    ("1 + 2", 0.0),                        # the last integer is 2
    ("33", 0.0), ("three", 0.0), ("", 0.0)])
def test_integer_reads_the_last_integer(answer, reward):
    assert resolve("integer")(answer, {"answer": 3}) == reward


def test_integer_reads_signs_and_refuses_a_record_without_a_number():
    assert last_integer("7 - 12 = -5") == -5
    assert resolve("integer")("-5", {"answer": "-5"}) == 1.0
    with pytest.raises(UserError, match="needs an integer answer, not 'five'"):
        resolve("integer")("5", {"answer": "five"})
    with pytest.raises(UserError, match="needs an 'answer' in every prompt record"):
        resolve("integer")("5", {"prompt": "What is 2 + 3?"})


def test_exact_and_regex():
    exact, regex = resolve("exact"), resolve("regex")
    assert exact(" Paris\n", {"answer": "Paris"}) == 1.0
    assert exact("Paris.", {"answer": "Paris"}) == 0.0
    assert regex("Paris.", {"answer": r"Paris\.?"}) == 1.0
    assert regex("It is Paris", {"answer": r"Paris\.?"}) == 0.0  # the whole answer must match
    with pytest.raises(UserError, match="is not a regular expression"):
        regex("x", {"answer": "(unclosed"})


def test_progression_counts_the_terms_at_their_places():
    verify = resolve("progression")
    assert verify("0144 0151", {"answer": [144, 151]}) == 1.0
    assert verify("0144 0150", {"answer": [144, 151]}) == 0.5
    assert verify("0151 0144", {"answer": [144, 151]}) == 0.0
    assert verify("01 4", {"answer": [144]}) == 0.0
    assert verify("0144", {"answer": [144, 151]}) == 0.5


def test_a_users_function(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(
        "def longer(answer, record):\n    return len(answer) / record['answer']\n"
        "def says_yes(answer, record):\n    return answer == 'yes'\n"
        "def broken(answer, record):\n    return 'good'\n"
        "def raises(answer, record):\n    raise KeyError('score')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    assert resolve("my_rewards:longer")("abcd", {"answer": 8}) == 0.5
    assert resolve("my_rewards:says_yes")("yes", {}) == 1.0
    with pytest.raises(UserError, match="returned 'good' for answer 'x': a reward is a finite"):
        resolve("my_rewards:broken")("x", {})
    with pytest.raises(UserError, match="raised KeyError"):
        resolve("my_rewards:raises")("x", {})
    with pytest.raises(UserError, match="has no function 'missing'"):
        resolve("my_rewards:missing")
    with pytest.raises(UserError, match="cannot import 'no_such_module_here'"):
        resolve("no_such_module_here:f")
    with pytest.raises(UserError, match="unknown verifier 'exactly'"):
        resolve("exactly")


def test_built_in_tasks():
    sums = tasks.addition_items(1)
    assert len(sums) == 100 and sums[37] == {"prompt": "What is 3 + 7?", "answer": 10}
    two = tasks.addition_items(2)
    assert len(two) == 8100 and all(10 <= int(r["prompt"].split()[2]) <= 99 for r in two)
    items = tasks.progression_items(4, 3, 2, seed=1)
    for record in items[:200]:
        given = [int(t) for t in record["prompt"].split()]
        d = given[1] - given[0]
        assert record["prompt"].endswith(" ") and all(len(t) == 4 for t in record["prompt"].split())
        assert d > 0 and given[2] - given[1] == d
        assert record["answer"] == [given[2] + d, given[2] + 2 * d]
        assert record["answer"][-1] <= 9999


def test_the_split_keeps_held_out_prompts_apart_when_it_can():
    items = [{"prompt": str(i), "answer": i} for i in range(10)]
    train, held, apart = tasks.split(items, 3, seed=0)
    assert apart and len(held) == 3 and len(train) == 7
    assert not {r["answer"] for r in train} & {r["answer"] for r in held}
    train, held, apart = tasks.split(items, 8, seed=0)  # 10 < 16: drawn from the same set
    assert not apart and len(held) == 8 and len(train) == 10


def test_a_prompts_file_is_read_whole_or_refused_by_line(tmp_path):
    good = tmp_path / "p.jsonl"
    good.write_text('{"prompt": "What is 1 + 1?", "answer": 2}\n\n'
                    '{"messages": [{"role": "user", "content": "Hi"}], "answer": "Hello"}\n')
    assert [r.get("answer") for r in tasks.read_prompts(good)] == [2, "Hello"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "x", "answer": 1}\n{"question": "y"}\n')
    with pytest.raises(UserError, match=r"bad.jsonl, line 2: a prompt record is a JSON object"):
        tasks.read_prompts(bad)
    bad.write_text('{"prompt": "x", "answer": 1}\nnot json\n')
    with pytest.raises(UserError, match="line 2: not valid JSON"):
        tasks.read_prompts(bad)
