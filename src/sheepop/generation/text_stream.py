"""Text from the generation loops (sheepop.generation.generate): pieces streamed as soon as they are
certain, and stop strings.

A token does not always end a character (byte-level BPE splits UTF-8 sequences), and a stop
string may span several tokens, so text is released only once the next pieces cannot change it:
`stream_text` for one prompt, `generate_texts` for a batch of prompts generated together.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol

from sheepop.config.schema import SampleConfig
from sheepop.generation.constraint import ConstraintState
from sheepop.generation.generate import generate, generate_batch
from sheepop.generation.protocol import BatchLanguageModel, LanguageModel
from sheepop.generation.speculative import Gate
from sheepop.generation.speed import Stopwatch


class TextDecoder(Protocol):
    """Ids -> text one token at a time (e.g. `sheepop.tokenizers.IncrementalDecoder`)."""

    def step(self, token_id: int) -> str: ...

    def flush(self) -> str: ...


class StopStrings:
    """Cuts a stream of text at the first stop string, which is not part of the output.

    Text that could be the beginning of a stop string is held back until the next pieces
    decide; everything before it is released at once.
    """

    def __init__(self, stops: Sequence[str] = ()):
        self.stops = [s for s in stops if s]
        self.pending = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        """The text now certain to be output; sets `stopped` once a stop string appears."""
        if self.stopped:
            return ""
        self.pending += text
        hits = [i for i in (self.pending.find(s) for s in self.stops) if i >= 0]
        if hits:
            out, self.pending, self.stopped = self.pending[:min(hits)], "", True
            return out
        hold = 0
        for s in self.stops:  # the longest tail of pending that begins some stop string
            for k in range(min(len(s) - 1, len(self.pending)), hold, -1):
                if self.pending.endswith(s[:k]):
                    hold = k
                    break
        cut = len(self.pending) - hold
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out

    def flush(self) -> str:
        """What was held back, once generation has ended without a stop string."""
        out, self.pending = ("" if self.stopped else self.pending), ""
        return out


def stream_text(lm: LanguageModel, prompt: Sequence[int], cfg: SampleConfig,
                decoder: TextDecoder, stop: Sequence[str] = (), eos_id: int | None = None,
                use_cache: bool = True, stopwatch: Stopwatch | None = None,
                constraint: ConstraintState | None = None, gate: Gate | None = None
                ) -> Iterator[str]:
    """Yield the generated text in pieces as soon as they are certain.

    Generation ends at `eos_id` (not shown), after `cfg.max_new_tokens`, or at the first of
    the `stop` strings (cut off, not shown). Concatenated, the pieces are the decoded new tokens
    up to that point. `stopwatch` notes when each token is drawn (sheepop.generation.speed).
    `constraint`: only the tokens its grammar allows (sheepop.generation.constraint). `gate`:
    speculative decoding's, whose counts the caller reads (sheepop.generation.speculative).
    """
    cut = StopStrings(stop)
    steps = generate(lm, prompt, cfg, use_cache, eos_id, constraint=constraint, gate=gate)
    for step in steps if stopwatch is None else stopwatch.watch(steps):
        if eos_id is not None and step.token == eos_id:
            break
        piece = cut.feed(decoder.step(step.token))
        if piece:
            yield piece
        if cut.stopped:
            return
    tail = cut.feed(decoder.flush())
    tail += cut.flush()
    if tail:
        yield tail


def generate_texts(lm: BatchLanguageModel, prompts: Sequence[Sequence[int]], cfg: SampleConfig,
                   decoders: Sequence[TextDecoder], stop: Sequence[str] = (),
                   eos_id: int | None = None, use_cache: bool = True,
                   seeds: Sequence[int] | None = None,
                   constraints: Sequence[ConstraintState | None] | None = None) -> list[str]:
    """The text generated after each prompt, all prompts in one batch (see `stream_text`);
    prompt b's only what `constraints[b]` allows."""
    if len(decoders) != len(prompts):
        raise ValueError(f"{len(decoders)} decoders for {len(prompts)} prompts")
    cuts = [StopStrings(stop) for _ in prompts]
    texts = [""] * len(prompts)
    done = [False] * len(prompts)
    steps = generate_batch(lm, prompts, cfg, use_cache, eos_id, seeds, constraints)
    step = next(steps, None)
    while step is not None:
        ended = set()
        for b, token in enumerate(step):
            if token is None or done[b]:
                continue
            if eos_id is not None and token == eos_id:
                done[b] = True
                continue
            texts[b] += cuts[b].feed(decoders[b].step(token))
            if cuts[b].stopped:
                done[b] = True
                ended.add(b)
        try:
            step = steps.send(ended)
        except StopIteration:
            step = None
    for b, cut in enumerate(cuts):
        if not cut.stopped:
            texts[b] += cut.feed(decoders[b].flush())
            texts[b] += cut.flush()
    return texts
