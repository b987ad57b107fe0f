"""Every worked example in docs/math/ (and docs/architectures.md, docs/finetune.md), recomputed
with sheepop's own functions.

The pages show inputs and the values a reader can follow by hand; a check (checks_*.py) runs the
code on the inputs and must reproduce every other value shown, to the decimals printed. So a
wrong number in the docs fails, and so does a value shown that no code computes.
"""

from __future__ import annotations

import pytest
from checks_architectures import CHECKS as ARCHITECTURE_CHECKS
from checks_lora import CHECKS as LORA_CHECKS
from checks_model import CHECKS as MODEL_CHECKS
from checks_text import CHECKS as TEXT_CHECKS
from checks_train import CHECKS as TRAIN_CHECKS
from mathdoc import all_examples, mismatches

CHECKS = {**TEXT_CHECKS, **MODEL_CHECKS, **TRAIN_CHECKS, **ARCHITECTURE_CHECKS, **LORA_CHECKS}
EXAMPLES = all_examples()


def test_every_example_has_a_known_kind():
    unknown = sorted({ex.id for ex in EXAMPLES if ex.kind not in CHECKS})
    assert not unknown, f"examples with no check: {unknown}"


@pytest.mark.parametrize("ex", EXAMPLES, ids=[ex.id for ex in EXAMPLES])
def test_worked_example(ex):
    inputs, check = CHECKS[ex.kind]
    missing = [k for k in inputs if k not in ex.values]
    assert not missing, f"{ex.id}: inputs {missing} are not given"
    shown = [k for k in ex.values if k not in inputs]
    assert shown, f"{ex.id}: an example must show at least one computed value"
    computed = check({k: ex.values[k] for k in inputs})
    problems = []
    for key in shown:
        if key not in computed:
            problems.append(f"{key}: shown on the page, but no code computes it")
            continue
        problems.extend(mismatches(ex.values[key], computed[key], key))
    assert not problems, f"{ex.id}:\n" + "\n".join(problems)
