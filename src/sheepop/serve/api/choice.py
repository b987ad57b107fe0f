"""One request (`Job`) and the sequences it generates (`Choice`), as the scheduler sees them.

A choice turns each row of logits the running batch gives it into one token, with the sampling
rule every sheepop loop uses (`sheepop.generation.generate.next_token`: the run's never-generated
ids excluded, then repetition penalty, temperature, top-k, top-p) and its own
`numpy.random.default_rng(seed + j)` for the j-th choice of a prompt, so a request with a seed
gets the tokens `sheepop generate --seed` gives. Its text is released as it becomes certain
(`sheepop.generation.text_stream.StopStrings`, `IncrementalDecoder`), and it ends at one of
the request's end tokens (EOS; <|end|> in a chat; not shown), at a stop string (cut off, not shown)
or after `max_tokens` tokens. Each token gives one `Event`, which the app turns into OpenAI's JSON.
A request with a response format (sheepop.serve.api.response_format) gives each choice its own
constraint state: the tokens it allows are the only ones drawn, before every other rule.
A choice that runs alone may be handed proposals (speculative decoding, when its request asks
for it: sheepop.serve.api.scheduler): `take` keeps or replaces each by the acceptance rule, so
its tokens are distributed as without them, and its `gate` counts them.

Log-probabilities are those of the model's own distribution, log softmax(z) with the
never-generated ids at -inf, whatever the temperature or top-p the token was drawn with (as
OpenAI's and vLLM's are). Beside them each generated token's `Sampled` says what the token was
actually drawn from: q, the distribution after the repetition penalty, temperature, top-k and
top-p (`sheepop.generation.generate.next_token`'s; greedy: all of q on the argmax), its
log q for the chosen token and its likeliest tokens (sheepop's extension of the JSON,
`sampled`, which the page tints by).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sheepop.generation.generate import next_token
from sheepop.generation.protocol import ProposalChecker
from sheepop.generation.sample import NonFiniteLogits
from sheepop.generation.speculative import Gate, check_pass
from sheepop.generation.speed import Stopwatch
from sheepop.generation.text_stream import StopStrings
from sheepop.serve.api.protocol import ApiError, Request
from sheepop.tokenizers import IncrementalDecoder, Tokenizer

NOT_FINITE = ApiError(422, "the model's logits are not finite (NaN or infinite: its weights or "
                          "activations overflow), so it cannot generate", code="non_finite_logits")


@dataclass
class Sampled:
    """The distribution q a token was drawn from (log q; -inf where q = 0)."""
    logprob: float                       # log q of the token drawn
    top: list[tuple[int, float, float]]  # q's likeliest tokens (q > 0): (id, log q, log p)


@dataclass
class Logprob:
    token: int
    logprob: float | None  # (None: a prompt's first token, which nothing predicts)
    top: list[tuple[int, float]]  # the most likely tokens and their log-probabilities
    sampled: Sampled | None = None  # (generated tokens only)


@dataclass
class Event:
    """What happened to one choice at one step."""
    index: int
    text: str = ""                  # the text now certain
    token: int | None = None        # the token drawn (None: no token, e.g. an error)
    logprob: Logprob | None = None  # (with logprobs; None for an end token, which is not shown)
    finish: str | None = None       # "stop" | "length" once the choice has ended
    error: ApiError | None = None
    prompt_logprobs: list[Logprob | None] | None = None  # (echo with logprobs, first event)
    # When it happened, on the model's thread: the speed log times the tokens by it, not by
    # when the response's coroutine takes them (it may take several steps' at once)
    at: float = field(default_factory=time.perf_counter)


def log_softmax(logits: np.ndarray, never: Sequence[int]) -> np.ndarray:
    """log p_i = z_i - log sum_j exp(z_j), in float64, z_i = -inf for the never-generated ids."""
    z = np.array(logits, dtype=np.float64)
    z[list(never)] = -np.inf
    m = z.max()
    return z - (m + np.log(np.exp(z - m).sum()))


def sampled(q: np.ndarray, logp: np.ndarray, token: int, k: int) -> Sampled:
    """The `Sampled` of distribution q (V,) whose draw was `token`; logp: log p, the model's."""
    top = np.flatnonzero(q > 0)
    top = top[np.argsort(-q[top], kind="stable")[:k]]
    with np.errstate(divide="ignore"):
        return Sampled(float(np.log(q[token])),
                       [(int(i), float(np.log(q[i])), float(logp[i])) for i in top])


def logprob(logp: np.ndarray, token: int, k: int) -> Logprob:
    top = np.argpartition(-logp, k - 1)[:k] if 0 < k < len(logp) else np.arange(len(logp))[:k]
    top = top[np.argsort(-logp[top], kind="stable")]
    return Logprob(int(token), float(logp[token]), [(int(i), float(logp[i])) for i in top])


class Job:
    """One HTTP request: its checked `Request`, its choices, its deadline, and whether it was
    cancelled (client gone, timeout, shutdown). `inbox` is the app's: where its events go;
    `stopwatch` times its tokens from its arrival to when the model drew each (`Event.at`)."""

    def __init__(self, request: Request, tokenizer: Tokenizer, timeout: float):
        self.request = request
        self.deadline = time.monotonic() + timeout
        self.stopwatch = Stopwatch(sum(len(p) for p in request.prompts))  # its speed, logged
        self.cancelled: str | None = None  # set from any thread; read by the scheduler
        self.cached_tokens = 0  # prompt tokens found in the prefix cache (set at admission)
        self.prefill_chunks = 0  # the passes that computed its prompts (past the cached part)
        self.inbox: Any = None
        n = request.n
        self.choices = [Choice(self, p * n + j, p, j, tokenizer)
                        for p in range(len(request.prompts)) for j in range(n)]

    def proposals(self) -> tuple[int, int, int]:
        """(proposed, accepted, checks): speculative decoding's counts over its choices."""
        gates = [c.gate for c in self.choices if c.gate is not None]
        return (sum(g.proposed for g in gates), sum(g.accepted for g in gates),
                sum(g.passes for g in gates))


class Choice:
    """One sequence being generated (row of the running batch while it runs)."""

    def __init__(self, job: Job, index: int, prompt_index: int, copy: int, tokenizer: Tokenizer):
        r = job.request
        self.job, self.index, self.prompt_index = job, index, prompt_index
        self.prompt = r.prompts[prompt_index]
        self.max_tokens = r.max_tokens[prompt_index]
        self.rng = np.random.default_rng(None if r.seed is None else r.seed + copy)
        self.decoder = IncrementalDecoder(tokenizer)
        self.cut = StopStrings(r.stop)
        self.seen = None
        if r.sample.repetition_penalty != 1.0:
            self.seen = np.zeros(tokenizer.vocab_size, dtype=bool)
            self.seen[self.prompt] = True
        self.shape = None if r.constraint is None else r.constraint.start(r.end_ids)
        # speculative decoding's proposals and when to make them (while it runs alone)
        self.gate = Gate() if r.sample.speculate else None
        self.generated = 0
        self.tokens: list[int] = []  # those generated, in order
        self.last = -1
        self.finish: str | None = None

    def take(self, logits: np.ndarray, never: Sequence[int], proposed: int | None = None
             ) -> Event:
        """Draw the next token from `logits` (V,), given the token speculative decoding
        `proposed` there (kept by the acceptance rule, or replaced); the event it makes."""
        r = self.job.request
        try:
            allowed = None if self.shape is None else self.shape.allowed(len(logits))
            token, q = next_token(logits, r.sample, self.rng, self.seen,
                                  want_probs=r.logprobs is not None, never=never,
                                  allowed=allowed, proposed=proposed)
        except NonFiniteLogits:  # (weights that overflow: no distribution to draw)
            self.finish = "error"
            return Event(self.index, error=NOT_FINITE)
        if self.shape is not None:
            self.shape.advance(token)
        self.generated += 1
        self.last = token
        self.tokens.append(token)
        if self.seen is not None:
            self.seen[token] = True
        if token in r.end_ids:
            return self._ended(Event(self.index, token=token), "stop")
        lp = None
        if r.logprobs is not None:
            logp = log_softmax(logits, never)
            lp = logprob(logp, token, r.logprobs)
            if r.sample.temperature <= 0:  # greedy: next_token reports softmax(z); q is 1-hot
                q = np.zeros(len(logp))
                q[token] = 1.0
            lp.sampled = sampled(q, logp, token, r.logprobs)
        event = Event(self.index, self.cut.feed(self.decoder.step(token)), token, lp)
        if self.cut.stopped:
            return self._ended(event, "stop")
        if self.generated >= self.max_tokens:
            return self._ended(event, "length")
        return event

    def speculate(self, lm: ProposalChecker, never: Sequence[int]) -> list[Event]:
        """One step of this choice, running alone in `lm`, with speculative decoding: up to
        its request's `speculate` tokens proposed from its prompt and output, checked in one
        pass (sheepop.generation.speculative.check_pass); the events of the tokens taken."""
        k = min(self.job.request.sample.speculate, lm.room() - 1,
                self.max_tokens - self.generated - 1)
        events: list[Event] = []

        def take(logits: np.ndarray, proposed: int | None) -> tuple[int, bool]:
            events.append(self.take(logits, never, proposed))
            return self.last, self.finish is not None

        check_pass(lm, self.prompt + self.tokens, k, self.gate, take)
        return events

    def _ended(self, event: Event, reason: str) -> Event:
        if not self.cut.stopped:  # what was held back (a stop string's possible beginning)
            event.text += self.cut.feed(self.decoder.flush()) + self.cut.flush()
        self.finish = event.finish = reason
        return event


def prompt_logprobs(logits: np.ndarray, prompt: Sequence[int], never: Sequence[int], k: int
                    ) -> list[Logprob | None]:
    """Each prompt token's log-probability after the tokens before it (`logits` (p, V): row t
    after prompt[:t+1]); None for the first, which nothing predicts (OpenAI's `echo`)."""
    return [None] + [logprob(log_softmax(logits[t - 1], never), prompt[t], k)
                     for t in range(1, len(prompt))]
