"""The built-in instruction set of the fine-tuning demonstration: small, checkable instructions.

Six kinds, each a one-turn conversation with exactly one right answer string:

    progression   "Continue: 3, 7, 11,"             -> "15"
    larger        "Which is larger, 37 or 52?"       -> "52"
    reverse       "Reverse: cat"                     -> "tac"
    upper         "Upper-case: cat"                  -> "CAT"
    count         "How many letters in cat?"         -> "3"
    after         "What comes after 41?"             -> "42"

Words are random lower-case letter strings (no word list to ship, and none the model could
know from pretraining). `TaskSpec` holds the sizes: word lengths, number ranges, terms shown.
The defaults are the sizes a pretrained `tiny` model learns to >= 90% held-out exact answers
in under 5 minutes of full fine-tuning on one CPU thread (docs/finetune.md): wider ranges
(3-digit numbers to compare, differences up to 9) leave `progression` far behind the rest.
Each default range still holds at least 100 held-out keys per kind (107 for `progression`).

The split is by construction, not by chance: every item has a key (the word for the word kinds,
so a held-out word appears in no training item of any kind; the unordered pair for `larger`;
(first term, difference) for `progression`; N for `after`) and the item is held out exactly when
the first byte of sha256(key) is below 256 / HELDOUT_ONE_IN. The region does not depend on the
seed: no training set of any seed holds a held-out prompt of any other. Held-out items are
distinct; training items are drawn with replacement (small kinds such as `after` have fewer
distinct prompts than a training set has items).

Scoring (`score`): exact match of the answer string after stripping surrounding whitespace
(str.strip), so "  52\n" counts for "52" but "52." and "052" do not. `cut_answer` turns generated
text into the answer: everything before the first end-of-turn marker.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sheepop.errors import UserError
from sheepop.files import atomic_write_text, read_text

KINDS = ("progression", "larger", "reverse", "upper", "count", "after")
HELDOUT_ONE_IN = 8  # one key in 8 is held out (a sha256 byte below 32)
TRAIN_FILE = "train.jsonl"
HELDOUT_FILE = "heldout.jsonl"
END_OF_TURN = "<|end|>"
LETTERS = "abcdefghijklmnopqrstuvwxyz"


@dataclass(frozen=True)
class TaskSpec:
    """What the generator draws (ranges inclusive)."""

    kinds: tuple[str, ...] = KINDS
    word_min: int = 3          # letters of a word (reverse, upper, count)
    word_max: int = 6
    number_max: int = 99       # larger: two distinct numbers in 0..number_max
    after_max: int = 999       # after: N in 0..after_max
    first_max: int = 149       # progression: first term in 0..first_max
    difference_max: int = 5    # progression: difference in 1..difference_max
    terms_shown: int = 3       # progression: terms given before the one to write

    def check(self) -> None:
        unknown = [k for k in self.kinds if k not in KINDS]
        if unknown or not self.kinds:
            raise UserError(f"unknown task kind(s) {unknown}: the kinds are {', '.join(KINDS)}")
        if not 1 <= self.word_min <= self.word_max:
            raise UserError(f"word lengths must satisfy 1 <= word_min <= word_max, got "
                            f"{self.word_min}..{self.word_max}")
        if min(self.number_max, self.after_max, self.first_max) < 1:
            raise UserError("number_max, after_max and first_max must be at least 1")
        if self.difference_max < 1 or self.terms_shown < 2:
            raise UserError("a progression needs difference_max >= 1 and terms_shown >= 2")


@dataclass(frozen=True)
class Item:
    kind: str
    prompt: str
    answer: str

    def messages(self, system: str | None = None) -> list[dict[str, str]]:
        """The conversation: [system], user prompt, assistant answer."""
        head = [{"role": "system", "content": system}] if system else []
        return head + [{"role": "user", "content": self.prompt},
                       {"role": "assistant", "content": self.answer}]

    def json_line(self, system: str | None = None) -> str:
        """One JSON Lines record: {"kind": ..., "messages": [...]} (readers of conversations
        ignore "kind"; the scorer reads it back)."""
        return json.dumps({"kind": self.kind, "messages": self.messages(system)},
                          ensure_ascii=False)


# ----- the kinds: each draws (split key, prompt, answer) -------------------------------------
Drawn = tuple[str, str, str]


def _word(rng: random.Random, spec: TaskSpec) -> str:
    n = rng.randint(spec.word_min, spec.word_max)
    return "".join(rng.choice(LETTERS) for _ in range(n))


def _progression(rng: random.Random, spec: TaskSpec) -> Drawn:
    a, d = rng.randint(0, spec.first_max), rng.randint(1, spec.difference_max)
    shown = ", ".join(str(a + i * d) for i in range(spec.terms_shown))
    return f"progression {a} {d}", f"Continue: {shown},", str(a + spec.terms_shown * d)


def _larger(rng: random.Random, spec: TaskSpec) -> Drawn:
    a, b = rng.sample(range(spec.number_max + 1), 2)
    return f"larger {min(a, b)} {max(a, b)}", f"Which is larger, {a} or {b}?", str(max(a, b))


def _reverse(rng: random.Random, spec: TaskSpec) -> Drawn:
    w = _word(rng, spec)
    return f"word {w}", f"Reverse: {w}", w[::-1]


def _upper(rng: random.Random, spec: TaskSpec) -> Drawn:
    w = _word(rng, spec)
    return f"word {w}", f"Upper-case: {w}", w.upper()


def _count(rng: random.Random, spec: TaskSpec) -> Drawn:
    w = _word(rng, spec)
    return f"word {w}", f"How many letters in {w}?", str(len(w))


def _after(rng: random.Random, spec: TaskSpec) -> Drawn:
    n = rng.randint(0, spec.after_max)
    return f"after {n}", f"What comes after {n}?", str(n + 1)


DRAW: dict[str, Callable[[random.Random, TaskSpec], Drawn]] = {
    "progression": _progression, "larger": _larger, "reverse": _reverse, "upper": _upper,
    "count": _count, "after": _after}


def is_heldout_key(key: str) -> bool:
    """Whether items with this split key belong to the held-out region (sha256, seed-free)."""
    return hashlib.sha256(key.encode("utf-8")).digest()[0] < 256 // HELDOUT_ONE_IN


def make_items(n: int, heldout: bool, seed: int, spec: TaskSpec | None = None) -> list[Item]:
    """`n` items of one split, the kinds in turn (item i is of kind spec.kinds[i % K]).
    Held-out items are distinct; a kind whose held-out region runs out is an error."""
    spec = spec or TaskSpec()
    spec.check()
    if n < 0:
        raise UserError(f"the number of items must be >= 0, got {n}")
    rng = random.Random(f"sheepop-tasks:{seed}:{'heldout' if heldout else 'train'}")
    items: list[Item] = []
    seen: set[str] = set()
    for i in range(n):
        kind = spec.kinds[i % len(spec.kinds)]
        for _ in range(1000 * HELDOUT_ONE_IN):
            key, prompt, answer = DRAW[kind](rng, spec)
            if is_heldout_key(key) == heldout and not (heldout and prompt in seen):
                break
        else:
            raise UserError(f"cannot draw {n // len(spec.kinds) + 1} distinct held-out "
                            f"'{kind}' items from these ranges: ask for fewer or widen them")
        seen.add(prompt)
        items.append(Item(kind, prompt, answer))
    return items


def write_demo_data(out_dir: str | Path, n_train: int, n_heldout: int, seed: int = 0,
                    spec: TaskSpec | None = None, system: str | None = None
                    ) -> dict[str, Path]:
    """Write train.jsonl and heldout.jsonl (one conversation a line) into `out_dir`;
    return their paths by split name."""
    out = Path(out_dir)
    paths = {"train": out / TRAIN_FILE, "heldout": out / HELDOUT_FILE}
    for split, count in (("train", n_train), ("heldout", n_heldout)):
        lines = [it.json_line(system) for it in make_items(count, split == "heldout", seed,
                                                            spec)]
        atomic_write_text(paths[split], "".join(line + "\n" for line in lines))
    return paths


def read_items(path: str | Path) -> list[Item]:
    """The items of a file written by `write_demo_data`: kind, the user prompt (the last user
    message) and the answer (the last message, which must be the assistant's)."""
    items = []
    text = read_text(path, missing=f"{path}: no such file (write it with write_demo_data)")
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            messages = record["messages"]
            user = [m["content"] for m in messages if m["role"] == "user"][-1]
            if messages[-1]["role"] != "assistant":
                raise ValueError("the last message is not the assistant's")
            items.append(Item(str(record["kind"]), user, messages[-1]["content"]))
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise UserError(f"{path}:{number}: not a demonstration item ({e})") from None
    return items


# ----- scoring -------------------------------------------------------------------------------
def cut_answer(generated: str, end: str = END_OF_TURN) -> str:
    """The answer in generated text: everything before the first `end` marker (all of it when
    there is none)."""
    return generated.split(end, 1)[0]


def score(answers: Sequence[str], items: Sequence[Item]) -> dict[str, Any]:
    """Exact-answer accuracy: exact = (1/N) sum_i [answers_i.strip() == items_i.answer], overall
    and by kind: {"exact": f, "n": N, "by_kind": {kind: {"exact": f_k, "n": N_k}}}."""
    if len(answers) != len(items):
        raise ValueError(f"{len(answers)} answers for {len(items)} items")
    if not items:
        raise ValueError("no items to score")
    hits: dict[str, list[int]] = {}
    for given, item in zip(answers, items):
        hits.setdefault(item.kind, []).append(int(given.strip() == item.answer))
    total = sum(sum(h) for h in hits.values())
    return {"exact": total / len(items), "n": len(items),
            "by_kind": {k: {"exact": sum(h) / len(h), "n": len(h)} for k, h in hits.items()}}
