"""Verifiers: what scores an answer, for `sheepop rl` (docs/finetune.md, "Reinforcement learning").

A verifier is a function `reward(answer, record) -> float` of the answer's text and the prompt's
record (a line of the prompts file, or a built-in task's item, holding at least `answer`):

    integer       1 if the answer's last integer equals int(record["answer"]), else 0
                  (SmolLM2 says "1 + 2 = 3 in mathematics.": the last integer is 3; "3 + 4 is
                  7." has 7; "-3" is -3)
    exact         1 if the answer's text, stripped, equals str(record["answer"]) stripped
    regex         1 if record["answer"], a regular expression, matches the stripped answer whole
    progression   the share of record["answer"]'s terms (the progression's next terms, a list)
                  that the answer writes at their places (the space-separated integers; each
                  read backwards when record["reverse_digits"]: a run that writes them so)
    module:func   a user's own Python: `func(answer, record)` from `module` (imported with the
                  current directory on the path), its value a number (True is 1)

A reward is a finite number; whatever a user's function returns otherwise is refused in one
line naming the function, as is a prompt record a verifier cannot read (no `answer`).
"""

from __future__ import annotations

import importlib
import math
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from sheepop.errors import UserError

Verifier = Callable[[str, Mapping[str, Any]], float]
INTEGER = re.compile(r"-?\d+")
BUILT_IN = ("integer", "exact", "regex", "progression")


def expected(record: Mapping[str, Any], verifier: str) -> Any:
    """record["answer"], or a UserError naming the verifier that needs it."""
    if "answer" not in record:
        raise UserError(f"the {verifier} verifier needs an 'answer' in every prompt record "
                        f"(this one has {', '.join(map(repr, record)) or 'nothing'})")
    return record["answer"]


def last_integer(text: str) -> int | None:
    """The last integer written in `text` (a leading minus sign included), None without one."""
    found = INTEGER.findall(text)
    return int(found[-1]) if found else None


def integer_reward(answer: str, record: Mapping[str, Any]) -> float:
    want = expected(record, "integer")
    try:
        want = int(want)
    except (TypeError, ValueError):
        raise UserError(f"the integer verifier needs an integer answer, not {want!r}") from None
    return float(last_integer(answer) == want)


def exact_reward(answer: str, record: Mapping[str, Any]) -> float:
    return float(answer.strip() == str(expected(record, "exact")).strip())


def regex_reward(answer: str, record: Mapping[str, Any]) -> float:
    pattern = expected(record, "regex")
    try:
        return float(re.fullmatch(str(pattern), answer.strip()) is not None)
    except re.error as e:
        raise UserError(f"the regex verifier: answer {pattern!r} is not a regular expression "
                        f"({e})") from None


def progression_reward(answer: str, record: Mapping[str, Any]) -> float:
    """The share of the expected next terms written at their places; a word that is not a
    number is a wrong term."""
    want = expected(record, "progression")
    terms = list(want) if isinstance(want, (list, tuple)) else [want]
    written = answer.split()
    if record.get("reverse_digits"):  # written least significant digit first
        written = [word[::-1] for word in written]
    right = sum(1 for k, term in enumerate(terms)
                if k < len(written) and written[k].isdigit() and int(written[k]) == int(term))
    return right / len(terms)


BUILT_IN_VERIFIERS: dict[str, Verifier] = {
    "integer": integer_reward, "exact": exact_reward, "regex": regex_reward,
    "progression": progression_reward}


def resolve(name: str) -> Verifier:
    """The verifier called `name`: a built-in one, or `module:function`; a name that is
    neither, a module that does not import or a function it lacks is one UserError."""
    if name in BUILT_IN_VERIFIERS:
        return BUILT_IN_VERIFIERS[name]
    module_name, sep, function_name = name.partition(":")
    if not sep or not module_name or not function_name:
        raise UserError(f"unknown verifier {name!r}: one of {', '.join(BUILT_IN)}, or "
                        "module:function (a Python function f(answer, record) -> reward)")
    if str(Path.cwd()) not in sys.path and "" not in sys.path:
        sys.path.insert(0, str(Path.cwd()))  # a module beside the user, as python -m finds it
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 - whatever the user's module raises on import
        raise UserError(f"verifier {name!r}: cannot import {module_name!r} "
                        f"({type(e).__name__}: {e})") from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise UserError(f"verifier {name!r}: {module_name!r} has no function "
                        f"{function_name!r}")
    return _checked(function, name)


def _checked(function: Callable[..., Any], name: str) -> Verifier:
    """A user's function whose rewards are checked: a finite number, or one line that says
    what it returned (or raised) for which answer."""
    def reward(answer: str, record: Mapping[str, Any]) -> float:
        try:
            value = function(answer, record)
        except Exception as e:  # noqa: BLE001 - the user's code: said in one line
            raise UserError(f"verifier {name!r} raised {type(e).__name__}: {e} (answer "
                            f"{answer[:60]!r})") from None
        if isinstance(value, bool):
            return float(value)
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            raise UserError(f"verifier {name!r} returned {value!r} for answer {answer[:60]!r}: "
                            "a reward is a finite number")
        return float(value)
    return reward
