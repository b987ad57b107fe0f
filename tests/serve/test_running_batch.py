"""`RunningBatch` (sheepop.generation.running_batch), the server's continuous batch, without HTTP:
sequences that join and leave at any step get exactly the greedy tokens they get alone, in both
engines, with absolute and rotary positions, through left extensions and compactions."""

from __future__ import annotations

import numpy as np
import pytest
from nan_memory import nan_memory
from serve_helpers import tiny_lm

from sheepop.config.schema import SampleConfig
from sheepop.generation.generate import generate
from sheepop.generation.running_batch import RunningBatch

CONTEXT = 48


def _requests(seed: int, count: int) -> list[tuple[int, list[int], int]]:
    """(arrival step, prompt, tokens to generate), each fitting in the context."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        prompt = [int(t) for t in rng.integers(1, 40, size=int(rng.integers(1, 30)))]
        out.append((int(rng.integers(0, 40)), prompt,
                    int(min(rng.integers(1, 40), CONTEXT - len(prompt)))))
    return out


def _run(lm, requests, capacity: int) -> tuple[list[list[int]], list[np.ndarray]]:
    """Greedy tokens of each request, joining at its arrival step (when a row is free) and
    leaving when done; and the logits each got at each step."""
    batch = RunningBatch(lm, capacity)
    out: list[list[int]] = [[] for _ in requests]
    seen: list[list[np.ndarray]] = [[] for _ in requests]
    waiting = sorted(range(len(requests)), key=lambda i: requests[i][0])
    running: list[int] = []
    step = 0

    def take(rows, logits):
        for i, z in zip(rows, logits):
            seen[i].append(z)
            out[i].append(int(np.argmax(z)))

    def leave():
        nonlocal running
        order = batch.leave([r for r, i in enumerate(running) if len(out[i]) >= requests[i][2]])
        running = [running[o] for o in order]

    while waiting or running:
        join = [i for i in waiting if requests[i][0] <= step][:batch.free]
        if join:
            waiting = [i for i in waiting if i not in join]
            take(join, batch.join([requests[i][1] for i in join]))
            running += join
            leave()
        if running:
            take(running, batch.step([out[i][-1] for i in running]))
            leave()
        step += 1
    return out, seen


@pytest.mark.parametrize("engine", ["torch", "numpy"])
@pytest.mark.parametrize("pos, digits", [("sinusoidal", 0), ("rope", 0), ("learned", 6)])
def test_joining_and_leaving_at_any_step_changes_no_token(engine, pos, digits, monkeypatch):
    """(digit places: the cache carries each row's run of digits, which follows its row; every
    cache's fresh memory holds NaN: a padding column read under a mask is a zeroed one)"""
    nan_memory(monkeypatch)
    lm = tiny_lm(engine, CONTEXT, pos, digits)
    shifts = []
    left = RunningBatch._shift_left
    monkeypatch.setattr(RunningBatch, "_shift_left",
                        lambda self, by: (shifts.append(by), left(self, by)))
    requests = _requests(1, 30)
    out, seen = _run(lm, requests, capacity=6)
    for (_, prompt, n), tokens, logits in zip(requests, out, seen):
        alone = [s.token for s in generate(lm, prompt, SampleConfig(temperature=0,
                                                                    max_new_tokens=n))]
        assert tokens == alone
        full = [lm.full(prompt + tokens[:t]) for t in range(n)]  # no cache at all
        np.testing.assert_allclose(np.stack(logits), np.stack(full), atol=2e-4)
    assert any(s > 0 for s in shifts)  # columns no row used were dropped along the way


def test_copies_share_one_prefill_and_rows_move_into_holes():
    lm = tiny_lm("numpy", CONTEXT, "sinusoidal")
    batch = RunningBatch(lm, 5)
    logits = batch.join([[1, 2, 3], [4]], copies=[3, 1])
    assert logits.shape[0] == 2 and batch.rows == 4
    assert list(batch.spans()) == [3, 3, 3, 1]
    batch.step([5, 6, 7, 8])
    order = batch.leave([0, 2])
    assert order == [3, 1] and list(batch.spans()) == [2, 4]  # the last row moved into row 0
    assert batch.leave([0, 1]) == [] and batch.rows == 0 and batch.length == 0
    with pytest.raises(ValueError):
        batch.join([[1]] * 6)
    with pytest.raises(ValueError):
        batch.leave([0])


@pytest.mark.parametrize("engine", ["torch", "numpy"])
@pytest.mark.parametrize("pos", ["sinusoidal", "rope"])
def test_a_lone_row_checks_proposals_as_decode_steps_and_rolls_back(engine, pos):
    """Speculative decoding in the server's batch (sheepop.generation.speculative.check_pass):
    `verify` on the lone running row gives the logits plain steps give, its padding columns
    included (a longer row left before), and `rollback` forgets the rejected tokens."""
    lm = tiny_lm(engine, CONTEXT, pos)
    long, short = list(range(1, 11)), [7, 3, 9, 2, 5]

    def lone_row() -> RunningBatch:  # the short row runs on alone from column 5 (too few
        # unused columns to compact them away)
        batch = RunningBatch(lm, 2)
        batch.join([long, short])
        batch.step([4, 6])
        batch.leave([0])
        return batch

    spec, plain = lone_row(), lone_row()
    assert list(spec.start[:1]) == [5] and spec.room() == CONTEXT - 6
    checked = [8, 1, 11, 13]
    rows = spec.verify(checked)
    steps = [plain.decode(t) for t in checked]
    # float32 logits of order 10 from sums over 32-128 terms: a wider product rounds
    # differently by a few ulps (1e-6 relative); 1e-4 leaves two orders of margin
    np.testing.assert_allclose(rows, np.stack(steps), atol=1e-4)
    spec.rollback(2)  # 11 and 13 rejected: the row holds short + [6, 8, 1]
    after = spec.decode(17)
    alone = RunningBatch(lm, 1)
    expected = alone.join([short + [6, 8, 1, 17]])[0]
    np.testing.assert_allclose(after, expected, atol=1e-4)
    assert list(spec.spans()) == [len(short) + 4]
    two = lone_row()
    two.join([[5]])
    assert two.room() == 0  # two rows advance together: no proposals
    with pytest.raises(ValueError):
        two.verify([1, 2])
