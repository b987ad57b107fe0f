"""The speed line of `generate`, `chat --speed` and `serve` (sheepop.generation.speed), read back
and checked for consistency: every count as the test knows it, every rate the quotient of the
count and the time printed beside it, within what the printed digits can tell (never a bound on
the time itself: the machine's speed is not the code's to promise)."""

from __future__ import annotations

import re

LINE = re.compile(
    r"prompt (?P<prompt>[\d,]+) tokens?, (?P<prompt_rate>[\d.]+) tokens/s \(time to first token "
    r"(?P<first_ms>[\d.]+) ms\); generated (?P<generated>[\d,]+) tokens, (?P<rate>[\d.]+) "
    r"tokens/s \(the (?P<after>[\d,]+) after the first in (?P<rest_ms>[\d.]+) ms\)")
RATE_STEP, MS_STEP = 0.1, 0.01  # the digits printed: rates to 0.1 token/s, times to 0.01 ms


def parse_speed(text: str) -> dict[str, float]:
    """The figures of the one speed line in `text` (an AssertionError if none or several)."""
    found = [m.groupdict() for m in LINE.finditer(text)]
    assert len(found) == 1, f"{len(found)} speed lines in {text!r}"
    return {k: float(v.replace(",", "")) for k, v in found[0].items()}


def rate_matches(count: float, ms: float, rate: float) -> bool:
    """Whether `rate` (tokens/s) printed to RATE_STEP is count / t for a time t that prints as
    `ms` to MS_STEP: t in [ms - MS_STEP/2, ms + MS_STEP/2], each side rounded once."""
    fastest = count * 1000 / max(ms - MS_STEP / 2, 1e-12)
    slowest = count * 1000 / (ms + MS_STEP / 2)
    return slowest - RATE_STEP / 2 <= rate <= fastest + RATE_STEP / 2


def check_speed(text: str, prompt: int, generated: int) -> dict[str, float]:
    """The speed line of `text`, its counts exact, its rates positive and consistent."""
    s = parse_speed(text)
    assert (s["prompt"], s["generated"], s["after"]) == (prompt, generated, generated - 1), s
    assert s["prompt_rate"] > 0 and s["rate"] > 0 and s["first_ms"] > 0 and s["rest_ms"] > 0, s
    assert rate_matches(s["prompt"], s["first_ms"], s["prompt_rate"]), s
    assert rate_matches(s["after"], s["rest_ms"], s["rate"]), s
    return s
