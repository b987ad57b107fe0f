"""`Lanes` (sheepop.generation.lanes), the server's running batch in lanes of their own
columns, without HTTP: sequences of very different lengths, joining (prefilled whole, or a chunk
at a time in the decode steps' passes) and leaving at any step, get exactly the greedy tokens
they get alone and the logits of a pass without a cache, in both engines, with absolute and
rotary positions; a long prompt opens a lane of its own (its cache taken as it is) and short
ones share one; a model with digit places keeps one lane."""

from __future__ import annotations

import numpy as np
import pytest
from nan_memory import nan_memory
from serve_helpers import tiny_lm

from sheepop.config.schema import SampleConfig
from sheepop.generation import lanes as lanes_module
from sheepop.generation.generate import generate
from sheepop.generation.lanes import Lanes
from sheepop.generation.prefill import Prefill

CONTEXT = 128


def _requests(seed: int, count: int) -> list[tuple[int, list[int], int, bool]]:
    """(arrival step, prompt, tokens to generate, whether it joins a chunk at a time): prompts
    of 1-8 tokens, and one in four of 60-100."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        n = int(rng.integers(60, 100)) if rng.random() < 0.25 else int(rng.integers(1, 9))
        prompt = [int(t) for t in rng.integers(1, 40, size=n)]
        out.append((int(rng.integers(0, 30)), prompt,
                    int(min(rng.integers(1, 25), CONTEXT - n)), bool(rng.random() < 0.5)))
    return out


def _run(lm, requests, capacity: int) -> tuple[list[list[int]], list[list[np.ndarray]], int]:
    """Each request's greedy tokens and the logits it got at each step, joining at its arrival
    step (when a row is free) and leaving when done; and the most lanes open at once."""
    lanes = Lanes(lm, capacity)
    out: list[list[int]] = [[] for _ in requests]
    seen: list[list[np.ndarray]] = [[] for _ in requests]
    waiting = sorted(range(len(requests)), key=lambda i: requests[i][0])
    joining: list[tuple[int, Prefill]] = []
    running: list[int] = []
    step, most = 0, 0

    def take(i: int, z: np.ndarray) -> None:
        seen[i].append(z)
        out[i].append(int(np.argmax(z)))

    def leave() -> None:
        nonlocal running
        order = lanes.leave([r for r, i in enumerate(running) if len(out[i]) >= requests[i][2]])
        running = [running[o] for o in order]

    def place(i: int, prefill: Prefill) -> None:
        first = lanes.place(prefill)
        running[first:first] = [i]
        take(i, prefill.logits)
        leave()

    while waiting or joining or running:
        arrived = [i for i in waiting if requests[i][0] <= step][:lanes.free - len(joining)]
        waiting = [i for i in waiting if i not in arrived]
        for i in arrived:
            prefill = Prefill(lm, requests[i][1])
            if requests[i][3] and running and lm.mixes:
                joining.append((i, prefill))  # a chunk at a time, in the steps' passes
            else:
                prefill.advance(CONTEXT)
                place(i, prefill)
        if running:
            chunks = [(p, 5) for _, p in joining]
            for i, z in zip(list(running), lanes.step([out[i][-1] for i in running], chunks)):
                take(i, z)
            leave()
            for i, prefill in [(i, p) for i, p in joining if p.finished]:
                joining.remove((i, prefill))
                place(i, prefill)
        else:
            for i, prefill in joining:  # (nothing runs: whole)
                prefill.advance(CONTEXT)
                place(i, prefill)
            joining = []
        most = max(most, len(lanes.lanes))
        step += 1
    return out, seen, most


@pytest.mark.parametrize("engine", ["torch", "numpy"])
@pytest.mark.parametrize("pos, digits", [("sinusoidal", 0), ("rope", 0), ("learned", 6)])
def test_sequences_in_lanes_get_the_tokens_they_get_alone(engine, pos, digits, monkeypatch):
    nan_memory(monkeypatch)  # fresh memory holds NaN: what is read is written or zeroed
    lm = tiny_lm(engine, CONTEXT, pos, digits)
    monkeypatch.setattr(lanes_module, "LANE_COST", 8)  # lanes open often in so small a context
    requests = _requests(3, 24)
    out, seen, most = _run(lm, requests, capacity=6)
    for (_, prompt, n, _), tokens, logits in zip(requests, out, seen):
        alone = [s.token for s in generate(lm, prompt, SampleConfig(temperature=0,
                                                                    max_new_tokens=n))]
        assert tokens == alone
        full = [lm.full(prompt + tokens[:t]) for t in range(n)]  # no cache at all
        np.testing.assert_allclose(np.stack(logits), np.stack(full), atol=2e-4)
    assert most == 1 if digits else most >= 3  # (digit places: one lane, every pass its own)


def test_a_long_prompt_opens_a_lane_of_its_own_and_short_ones_share_one():
    lm = tiny_lm("numpy", CONTEXT, "rope")
    lanes = Lanes(lm, 8)

    def prefilled(n: int, seed: int) -> Prefill:
        p = Prefill(lm, [int(t) for t in np.random.default_rng(seed).integers(1, 40, size=n)])
        p.advance(n)
        return p

    assert lanes.place(prefilled(5, 0)) == 0
    assert lanes.place(prefilled(7, 1), copies=2) == 1  # (into the first lane: rows 1 and 2)
    assert [lane.rows for lane in lanes.lanes] == [3]
    long = prefilled(100, 2)
    assert lanes.place(long) == 3  # 100 columns for 3 more rows: a lane of its own ...
    assert lanes.lanes[1].store.k is long.cache.k  # ... which takes its cache, not a copy
    assert lanes.place(prefilled(6, 3)) == 3  # the short one goes with the short ones
    assert [lane.rows for lane in lanes.lanes] == [4, 1]
    assert lanes.room() == 0
    lanes.step([1] * 5)
    assert lanes.leave([0, 4]) == [3, 1, 2]  # the long lane closes; row 3 moves into row 0
    assert [lane.rows for lane in lanes.lanes] == [3]
    assert lanes.leave([1, 2]) == [0] and lanes.room() > 1  # one row: speculation may check
