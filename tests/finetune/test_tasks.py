"""The demonstration's instruction set (sheepop.finetune.tasks): deterministic, every answer
right by an independent check, held-out items disjoint from training, and the scorer's numbers."""

from __future__ import annotations

import hashlib
import json
import re

import pytest

from sheepop.errors import UserError
from sheepop.finetune.tasks import (
    KINDS,
    Item,
    TaskSpec,
    cut_answer,
    make_items,
    read_items,
    score,
    write_demo_data,
)


def expected_answer(item: Item) -> str:
    """The answer recomputed from the prompt text alone (not through the generator)."""
    if item.kind == "progression":
        terms = [int(t) for t in re.fullmatch(r"Continue: (\d+(?:, \d+)+),", item.prompt)
                 .group(1).split(", ")]
        steps = {b - a for a, b in zip(terms, terms[1:])}
        assert len(steps) == 1 and steps.pop() > 0, item
        return str(2 * terms[-1] - terms[-2])
    if item.kind == "larger":
        a, b = map(int, re.fullmatch(r"Which is larger, (\d+) or (\d+)\?", item.prompt).groups())
        assert a != b, item
        return str(a if a > b else b)
    if item.kind == "after":
        return str(int(re.fullmatch(r"What comes after (\d+)\?", item.prompt).group(1)) + 1)
    pattern = {"reverse": r"Reverse: ([a-z]+)", "upper": r"Upper-case: ([a-z]+)",
               "count": r"How many letters in ([a-z]+)\?"}[item.kind]
    word = re.fullmatch(pattern, item.prompt).group(1)
    return {"reverse": "".join(reversed(word)), "upper": word.upper(),
            "count": str(len(word))}[item.kind]


def word_of(item: Item) -> str | None:
    m = re.search(r"(?:Reverse: |Upper-case: |letters in )([a-z]+)", item.prompt)
    return m.group(1) if m else None


@pytest.mark.parametrize("heldout", [False, True])
def test_every_answer_is_right_and_the_kinds_take_turns(heldout):
    items = make_items(600, heldout, seed=3)
    assert [it.kind for it in items] == [KINDS[i % 6] for i in range(600)]
    for it in items:
        assert it.answer == expected_answer(it)


def test_the_ranges_of_the_spec_are_kept():
    spec = TaskSpec(word_min=2, word_max=4, number_max=50, after_max=40, first_max=10,
                    difference_max=3, terms_shown=4)
    items = make_items(1200, False, seed=1, spec=spec)
    words = {len(w) for w in map(word_of, items) if w}
    assert words == {2, 3, 4}
    larger = [int(it.answer) for it in items if it.kind == "larger"]
    assert max(larger) <= 50 and min(larger) >= 1
    assert max(int(it.answer) for it in items if it.kind == "after") <= 41
    for it in items:
        if it.kind == "progression":
            terms = it.prompt.removeprefix("Continue: ").rstrip(",").split(", ")
            assert len(terms) == 4 and int(terms[0]) <= 10
            assert 1 <= int(terms[1]) - int(terms[0]) <= 3


def test_the_generator_is_deterministic_for_a_seed(tmp_path):
    assert make_items(300, False, seed=5) == make_items(300, False, seed=5)
    assert make_items(300, False, seed=5) != make_items(300, False, seed=6)
    a = write_demo_data(tmp_path / "a", 200, 60, seed=9)
    b = write_demo_data(tmp_path / "b", 200, 60, seed=9)
    for split in ("train", "heldout"):
        assert a[split].read_bytes() == b[split].read_bytes()


def test_heldout_items_appear_in_no_training_set_of_any_seed():
    heldout = make_items(600, True, seed=0)
    assert len({it.prompt for it in heldout}) == 600  # distinct
    train = [it for seed in range(3) for it in make_items(3000, False, seed)]
    assert not {it.prompt for it in heldout} & {it.prompt for it in train}
    # a held-out word is in no training item of any kind, so a word kind cannot be answered
    # from another kind's training item
    held_words = {word_of(it) for it in heldout} - {None}
    assert len(held_words) > 250
    assert not held_words & {word_of(it) for it in train}
    # nor a held-out pair of `larger` in the other order
    pairs = {frozenset(re.findall(r"\d+", it.prompt)) for it in heldout if it.kind == "larger"}
    assert not pairs & {frozenset(re.findall(r"\d+", it.prompt)) for it in train
                        if it.kind == "larger"}


def test_the_heldout_region_is_one_sha256_byte_in_eight_and_can_run_out():
    # `after` with N in 0..999: held out exactly when sha256("after N")[0] < 32
    region = {n for n in range(1000) if hashlib.sha256(f"after {n}".encode()).digest()[0] < 32}
    spec = TaskSpec(kinds=("after",))
    every = make_items(len(region), True, seed=0, spec=spec)
    assert {int(it.answer) - 1 for it in every} == region
    with pytest.raises(UserError, match="distinct held-out 'after' items"):
        make_items(len(region) + 1, True, seed=0, spec=spec)


def test_files_round_trip_with_a_system_message(tmp_path):
    paths = write_demo_data(tmp_path, 30, 12, seed=2, system="Answer briefly.")
    lines = paths["heldout"].read_text().splitlines()
    assert len(lines) == 12
    record = json.loads(lines[0])
    assert [m["role"] for m in record["messages"]] == ["system", "user", "assistant"]
    assert record["messages"][0]["content"] == "Answer briefly."
    assert read_items(paths["heldout"]) == make_items(12, True, seed=2)
    assert read_items(paths["train"]) == make_items(30, False, seed=2)


def test_bad_specs_and_files_are_one_clear_error(tmp_path):
    with pytest.raises(UserError, match="unknown task kind"):
        make_items(5, False, 0, TaskSpec(kinds=("sort",)))
    with pytest.raises(UserError, match="word lengths"):
        make_items(5, False, 0, TaskSpec(word_min=5, word_max=4))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"kind": "after", "messages": [{"role": "user", "content": "x"}]}\n')
    with pytest.raises(UserError, match="bad.jsonl:1: not a demonstration item"):
        read_items(bad)


def test_the_scorer_on_a_hand_made_set():
    items = [Item("after", "What comes after 9?", "10"),
             Item("after", "What comes after 41?", "42"),
             Item("upper", "Upper-case: ab", "AB"),
             Item("upper", "Upper-case: cd", "CD"),
             Item("count", "How many letters in abc?", "3")]
    # surrounding whitespace is stripped; anything else must match exactly
    answers = [" 10\n", "042", "AB", "cd", "3."]
    assert score(answers, items) == {
        "exact": 2 / 5, "n": 5,
        "by_kind": {"after": {"exact": 0.5, "n": 2}, "upper": {"exact": 0.5, "n": 2},
                    "count": {"exact": 0.0, "n": 1}}}
    assert score([it.answer for it in items], items)["exact"] == 1.0
    with pytest.raises(ValueError, match="4 answers for 5 items"):
        score(answers[:4], items)


def test_cut_answer_keeps_what_comes_before_the_end_of_turn():
    assert cut_answer("42<|end|>\n<|user|>") == "42"
    assert cut_answer("no end here") == "no end here"
    assert cut_answer("<|end|>") == ""
