"""What a training run shows while it trains, on standard error.

On a terminal, a progress bar (tqdm) with the loss, learning rate and tokens/s, and each
evaluation written above it. Anywhere else (a log file, a pipe, `nohup`, `--no-progress`), the
bar would be one carriage-return update per step, unreadable in a file; instead, a plain line
every `train.log_interval` steps and one per evaluation, each flushed at once, so that `tail -f`
follows the run:

    step 40/266  loss 2.3127  lr 9.82e-04  12,345 tokens/s  ETA 1m 52s
    step 200/266  val loss 1.9876 (perplexity 7.30, 2.1342 bits/byte), a new best

ETA = remaining steps x the seconds per step of this session so far (or the time left to
train.max_minutes, when that is sooner).

Modes: "bar", "lines", "off" (nothing), and "auto" (True): the bar when the stream is a terminal,
else the lines.
"""

from __future__ import annotations

import sys
from typing import TextIO

from tqdm import tqdm

from sheepop.tokenizers.token_bytes import perplexity
from sheepop.words import duration, plural

MODES = ("auto", "bar", "lines", "off")


def resolve_mode(mode: str | bool, stream: TextIO) -> str:
    """The mode to use on `stream`: True is "auto", False is "off"; "auto" is the bar on a
    terminal, else plain lines."""
    mode = {True: "auto", False: "off"}.get(mode, mode) if isinstance(mode, bool) else mode
    if mode not in MODES:
        raise ValueError(f"progress mode must be one of {MODES}, not {mode!r}")
    if mode == "auto":
        isatty = getattr(stream, "isatty", None)
        return "bar" if isatty is not None and isatty() else "lines"
    return mode


class Progress:
    """The bar or the lines of one training session, from step `start` to `steps`."""

    def __init__(self, mode: str | bool, steps: int, start: int, log_interval: int,
                 stream: TextIO | None = None, max_seconds: float = 0.0):
        self.stream = stream if stream is not None else sys.stderr
        self.mode = resolve_mode(mode, self.stream)
        self.steps, self.start, self.log_interval = steps, start, log_interval
        self.max_seconds = max_seconds
        self.last = (start, f"{start}/{steps}")  # the last step, as the lines say it
        self.bar = tqdm(total=steps, initial=start, desc="train", unit="step",
                        dynamic_ncols=True, file=self.stream, disable=self.mode != "bar")

    def eta(self, step: int, elapsed: float) -> float:
        """Seconds left: the remaining steps at this session's pace, capped by max_minutes."""
        done = step - self.start
        left = (self.steps - step) * elapsed / done if done > 0 else 0.0
        if self.max_seconds:
            left = min(left, max(self.max_seconds - elapsed, 0.0))
        return left

    def step(self, step: int, loss: float, lr: float, tokens_per_sec: float,
             elapsed: float) -> None:
        """After optimizer step `step` (1-based) of `self.steps`."""
        if self.mode == "bar":
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}",
                                 tok_s=f"{tokens_per_sec:,.0f}")
        self.last = (step, self._of(step, elapsed))
        if self.mode == "lines" and (step % self.log_interval == 0 or step == self.steps):
            self._line(f"step {self.last[1]}  loss {loss:.4f}  lr {lr:.2e}  "
                       f"{tokens_per_sec:,.0f} tokens/s  ETA {duration(self.eta(step, elapsed))}")

    def _of(self, step: int, elapsed: float) -> str:
        """'40/266', or, when train.max_minutes ends the run before its steps would (a phase
        bounded by time, its steps only a ceiling), '620 (2m 13s of a 5m 00s budget)'; the
        bar then counts steps without a total, under the budget's name."""
        done = step - self.start
        by_steps = (self.steps - step) * elapsed / done if done > 0 else 0.0
        if not (self.max_seconds and by_steps > self.max_seconds - elapsed):
            return f"{step}/{self.steps}"
        budget = duration(self.max_seconds)
        if self.mode == "bar" and self.bar.total is not None:
            self.bar.total = None
            self.bar.set_description(f"train ({budget} budget)", refresh=False)
        return f"{step} ({duration(elapsed)} of a {budget} budget)"

    def note(self, text: str) -> None:
        """A line about the run (an evaluation): above the bar, or one plain line; its
        'step N/STEPS' said as the step lines say it (a time budget's)."""
        step, label = self.last
        ceiling = f"step {step}/{self.steps} "
        if text.startswith(ceiling):
            text = f"step {label} {text[len(ceiling):]}"
        if self.mode == "bar":
            self.bar.write(text, file=self.stream)
        elif self.mode == "lines":
            self._line(text)

    def say(self, text: str) -> None:
        """A message for the user on standard output, above the bar when there is one (e.g.
        "interrupted: saving a checkpoint"), whatever the mode."""
        self.bar.write(text)

    def _line(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        self.bar.close()


def evaluation_line(step: int, steps: int, val: float, bpb: float | None, best: bool,
                    best_val: float, best_step: int | None, stale: int) -> str:
    """The line of one evaluation: its figures and how it compares with the best so far."""
    per_byte = f", {bpb:.4f} bits/byte" if bpb is not None else ""
    if best:
        verdict = "a new best"
    else:
        verdict = (f"best {best_val:.4f} at step {best_step} "
                   f"({plural(stale, 'evaluation')} without a new best)")
    return (f"step {step}/{steps}  val loss {val:.4f} (perplexity {perplexity(val):.2f}"
            f"{per_byte}), {verdict}")
