"""Sampling settings outside their ranges are a programming error through the Python API
(issue 13, item 14): `top_p = 0` used to give all-NaN probabilities and silently draw token 0.
The command line refuses the same values with one line (tests/core/test_config.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sheepop.config.schema import SampleConfig
from sheepop.generation.generate import generate, next_token
from sheepop.generation.sample import penalize_repeats, probabilities

LOGITS = np.log([0.5, 0.2, 0.15, 0.1, 0.05])


@pytest.mark.parametrize("settings, message", [
    ({"top_p": 0.0}, r"top_p must be in \(0, 1\] \(1: off\), not 0.0"),
    ({"top_p": -0.5}, r"top_p must be in \(0, 1\]"),
    ({"top_p": 1.5}, r"top_p must be in \(0, 1\]"),
    ({"top_p": math.nan}, r"top_p must be in \(0, 1\]"),
    ({"temperature": -1.0}, r"temperature must be a finite number >= 0 \(0: greedy\)"),
    ({"temperature": math.inf}, "temperature must be a finite number >= 0"),
    ({"temperature": math.nan}, "temperature must be a finite number >= 0"),
    ({"top_k": -1}, r"top_k must be an integer >= 0 \(0: off\), not -1"),
    ({"top_k": 1.5}, "top_k must be an integer >= 0"),
])
def test_probabilities_refuses_settings_out_of_range(settings, message):
    with pytest.raises(ValueError, match=message):
        probabilities(LOGITS, **{"temperature": 1.0, **settings})


def test_the_edges_of_the_ranges_still_work():
    assert probabilities(LOGITS, temperature=1.0, top_p=1.0) == pytest.approx(np.exp(LOGITS))
    assert probabilities(LOGITS, temperature=1.0, top_p=1e-9).tolist() == [1, 0, 0, 0, 0]
    assert probabilities(LOGITS, temperature=0.0, top_k=np.int64(2)).tolist() == [1, 0, 0, 0, 0]


def test_a_repetition_penalty_must_be_positive():
    seen = np.array([True, False, False, False, False])
    for penalty in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="repetition penalty must be a finite number > 0"):
            penalize_repeats(LOGITS, seen, penalty)


def test_the_generation_loop_refuses_before_drawing(small_lm):
    """Greedy decoding never reaches `probabilities`; the loop checks every setting anyway."""
    rng = np.random.default_rng(0)
    for cfg in (SampleConfig(top_p=0.0), SampleConfig(temperature=0.0, top_p=0.0),
                SampleConfig(temperature=-1.0), SampleConfig(top_k=-3)):
        with pytest.raises(ValueError):
            next_token(LOGITS, cfg, rng)
        with pytest.raises(ValueError):
            next(generate(small_lm, [1, 2, 3], cfg))
