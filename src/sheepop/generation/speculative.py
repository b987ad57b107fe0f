"""Speculative decoding by prompt lookup: tokens guessed from the text itself, checked by the
model in one forward pass, kept only as far as the model would have written them.

Proposal (prompt lookup; Saxena 2023). Let x_1..x_n be the text so far (prompt and output).
For g = NGRAM_MAX down to NGRAM_MIN (3, 2), find the latest i < n - g + 1 with
x_i..x_{i+g-1} = the last g tokens; the proposal is d_1..d_k = the k tokens that followed that
occurrence (fewer where the text ends first). An edit of a given function, a summary that
quotes: the output copies runs of its prompt, and a copied run is proposed whole.

Check. The cache holds x_1..x_{n-1}; one pass over x_n, d_1, ..., d_k gives the model's logits
after each of them, z_0..z_k (sheepop.generation.cached_lm.CachedLM.verify). Position j's
distribution p_j is the one plain sampling would draw from there (the same filters: the
`never` ids, a constraint's mask, the repetition penalty over the text up to it, temperature,
top-k, top-p, min-p), and j walks 0, 1, ...:

    accept d_{j+1} with probability p_j(d_{j+1});
    else draw the token from r_j = (p_j - q)+ / sum (p_j - q)+,  q = onehot(d_{j+1}):
         p_j with d_{j+1} removed, renormalised; and stop;
    all k accepted: one more token from p_k (the pass computed it).

Each token is then distributed exactly as p_j: P(t) = p_j(d) [t = d] + (1 - p_j(d)) r_j(t) =
p_j(t) for t != d (r_j(t) = p_j(t) / (1 - p_j(d))), and p_j(d) for t = d
(docs/inference.md, "Speculative decoding" derives it for the whole sequence). Greedy
decoding is the case p_j = onehot(argmax z_j): d is kept iff it is the argmax, the same token
plain decoding writes. The rejected proposals' keys and values leave the cache
(`CachedLM.rollback`). A pass yields 1 .. k + 1 tokens for the cost of one pass over k + 1
positions, which costs far less than k + 1 decode steps (a decode step reads every weight once
for one row; k + 1 rows reuse each weight read).

It turns itself off where it does not pay (`Gate`), judged from the pass's cost and the
acceptance it has seen. A pass over m = k + 1 positions costs c(m) decode steps (PASS_COST,
measured: more than 1, since the k + 1 rows go through the BLAS library's matrix-matrix path,
which repacks every weight it reads). Prompt lookup's proposals are kept as copies are: the
first token tells whether the text copies here, the others how long the copy runs. So the gate
estimates p, the chance a pass's first proposal is kept, and q, the chance a proposal after a
kept one is kept, from the passes seen (counts weighted by 2^(-age / HALF_LIFE tokens), and
prior counts: p as if 1 of 2 first proposals were kept, q as if 2 of 3 later ones); a pass of
k proposals then yields on average

    1 + G(k) tokens,   G(k) = sum_{i=1..k} p q^(i-1) = p (1 - q^k) / (1 - q),

for c(k + 1) steps, where plain decoding yields c(k + 1) tokens. It proposes the k <= the
asked-for K that maximises V(k) = (1 + G(k)) / c(k + 1) (low acceptance shrinks k, down to 1),
and pauses when even that V(k) < MIN_PAYOFF (a margin over the break-even 1 for the cost's
error). While paused, every step is a plain decode step, and the gate keeps learning for free:
it still makes the proposal it would have checked, leaves it unchecked, and follows it through
the tokens that come, each matched one a proposal kept and the first that differs one turned
down, which is what the check would have found (greedy: a proposal is kept iff it is the
argmax, the token then written; sampling: it is kept with probability p_j(d), the chance that
the token drawn is d). Those counts update p and q as a checked pass's do, and the gate opens
again as soon as V(k) >= MIN_PAYOFF, part way through a copy it is following, so the next
pass proposes the rest of it. A text that does not copy costs its first pass, and another
only where a followed proposal ran long enough to pay. The first pass proposes all K (nothing
is known yet; a copy from the first token is taken whole). The gate reads only counts, never
clocks, so a seed gives the same text every time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from sheepop.config.schema import SampleConfig
from sheepop.generation.constraint import ConstraintState
from sheepop.generation.protocol import CheckingLanguageModel, ProposalChecker
from sheepop.generation.sample import check_finite, draw, filtered_logits, probabilities
from sheepop.softmax import softmax

# The n-grams looked up, longest first: 3 tokens find the place a copy continues from more
# surely than 2; a single token recurs everywhere (a space, a bracket), and its proposals were
# mostly rejected on SmolLM2's code edit, each costing a pass (benchmarks/speculative.py).
NGRAM_MAX, NGRAM_MIN = 3, 2
# A checking pass over m positions in decode steps (benchmarks/speculative.py --pass-cost:
# SmolLM2, torch, one thread, the 2-core Intel Xeon with AVX-512, load 5.8-6.8, medians of 30
# and 50 of each, 2026-12-02; the 2-core AMD EPYC measured 1.5 at 2, 2.85 at 9, 3.4 at 17),
# linear between the points, the last slope beyond (`pass_cost`).
PASS_COST = ((1, 1.0), (2, 1.45), (3, 1.5), (5, 1.75), (9, 2.0), (17, 2.1), (33, 2.35))
# Propose only where a pass is expected to yield this many tokens per decode step of its cost
# (1 is break-even; the margin covers the cost's error across machines and loads).
MIN_PAYOFF = 1.1
# Evidence of acceptance halves in weight every HALF_LIFE tokens: a text starts and stops
# copying within tens of tokens (a quoted sentence, a function); on simulated answers that
# switch between copying and not, 16 followed them better than 8, 32 or 64.
HALF_LIFE = 16
# The prior counts (kept, checked) of first and of later proposals.
PRIOR_FIRST, PRIOR_FURTHER = (1.0, 2.0), (2.0, 3.0)


def propose(ids: Sequence[int], k: int, ngram_max: int = NGRAM_MAX,
            ngram_min: int = NGRAM_MIN) -> list[int]:
    """Up to k tokens that followed the latest earlier occurrence of the last g tokens of
    `ids` (g = ngram_max .. ngram_min, the longest found first); [] when none recurs."""
    if k <= 0 or len(ids) < ngram_min + 1:
        return []
    x = np.asarray(ids, dtype=np.int64)
    n = len(x)
    for g in range(min(ngram_max, n - 1), ngram_min - 1, -1):
        tail = x[n - g:]
        # starts i of g-grams x[i:i+g] that end before the text's own last g tokens
        match = np.ones(n - g, dtype=bool)
        for j in range(g):
            match &= x[j:n - g + j] == tail[j]
        found = np.flatnonzero(match)
        if len(found):
            after = int(found[-1]) + g
            return x[after:after + k].tolist()
    return []


def judge(z: np.ndarray, cfg: SampleConfig, rng: np.random.Generator, proposed: int | None,
          want_probs: bool = False) -> tuple[int, np.ndarray | None]:
    """The token at one position, from its filtered logits `z`, given the `proposed` one (None:
    a plain draw); and the distribution p it is distributed as (greedy: softmax(z), only when
    `want_probs`). Sampling: `proposed` with probability p(proposed), else a draw from p with
    `proposed` removed (the residual (p - onehot(d))+, renormalised); greedy: the argmax."""
    if cfg.temperature <= 0:
        return int(np.argmax(z)), (softmax(np.asarray(z, np.float64)) if want_probs else None)
    probs = probabilities(z, cfg.temperature, cfg.top_k, cfg.top_p, cfg.min_p)
    if proposed is None:
        return draw(probs, rng), probs
    if rng.random() < probs[proposed]:
        return proposed, probs
    residual = probs.copy()
    residual[proposed] = 0.0  # p(proposed) < 1 here (u < 1 always accepts it at 1)
    return draw(residual, rng), probs


def pass_cost(m: int) -> float:
    """c(m): a pass over m positions in decode steps, from PASS_COST (linear between its
    points, the last segment's slope beyond)."""
    points = PASS_COST
    for (m0, c0), (m1, c1) in zip(points, points[1:]):
        if m <= m1 or (m1, c1) == points[-1]:
            return c0 + (c1 - c0) * (m - m0) / (m1 - m0)
    raise AssertionError("PASS_COST has at least two points")


@dataclass
class Gate:
    """When to propose, and how many (`proposals`): the k <= K that maximises the expected
    tokens a pass yields per decode step of its cost; none while that is below MIN_PAYOFF,
    until the proposals it watches unchecked say it pays again (the module's docstring). p is
    estimated from `first` (weighted counts: first proposals checked or watched, kept), q
    from `further` (the later ones)."""
    first: list[float] = field(default_factory=lambda: [0.0, 0.0])
    further: list[float] = field(default_factory=lambda: [0.0, 0.0])
    paused: bool = False
    limit: int = 0  # the most proposals last asked for (K)
    watched: list[int] | None = None  # while paused: the proposal it would have checked
    followed: int = 0  # how many of `watched` the tokens since have matched
    passes: int = 0  # checks of proposals
    proposed: int = 0
    accepted: int = 0
    tokens: int = 0  # generated while speculating, in `steps` forward passes
    steps: int = 0

    def open(self) -> bool:
        return not self.paused

    def rates(self) -> tuple[float, float]:
        """(p, q): a first proposal kept, a later one kept after a kept one (with the prior
        counts: 1 of 2, 2 of 3)."""
        (c0, k0), (c1, k1) = self.first, self.further
        (a0, n0), (a1, n1) = PRIOR_FIRST, PRIOR_FURTHER
        return (k0 + a0) / (c0 + n0), (k1 + a1) / (c1 + n1)

    def value(self, k: int) -> float:
        """V(k) = (1 + G(k)) / c(k + 1): the tokens a pass of k proposals yields on average,
        per decode step of its cost (plain decoding: 1)."""
        p, q = self.rates()
        gain = p * (1.0 - q ** k) / (1.0 - q)
        return (1.0 + gain) / pass_cost(k + 1)

    def best(self, limit: int) -> int:
        """The k in 1..limit with the largest V(k) (the smallest of equals)."""
        return max(range(1, limit + 1), key=lambda k: (self.value(k), -k))

    def pays(self) -> bool:
        return self.limit > 0 and self.value(self.best(self.limit)) >= MIN_PAYOFF

    def proposals(self, limit: int) -> int:
        """How many tokens to propose now, at most `limit`: 0 while paused, all of them
        before the first pass, else `best`."""
        self.limit = limit
        if limit <= 0 or self.paused:
            return 0
        return limit if self.passes == 0 else self.best(limit)

    def watching(self) -> bool:
        """Whether it wants a proposal to watch (paused, and none being watched)."""
        return self.paused and self.watched is None

    def watch(self, draft: list[int]) -> None:
        """The proposal it would have checked now, to be compared with the tokens to come."""
        if draft:
            self.watched, self.followed = draft, 0

    def record(self, proposed: int, accepted: int, rejected: bool) -> None:
        """A pass checked `proposed` tokens and kept the first `accepted`; `rejected`: the
        walk stopped at a proposal turned down (else it ended with the sequence, or kept them
        all). Then: pause, if no number of proposals pays."""
        self.passes += 1
        self.proposed += proposed
        self.accepted += accepted
        self._learn(accepted, rejected)
        self.paused = not self.pays()

    def _learn(self, accepted: int, rejected: bool) -> None:
        for position in range(accepted):
            self._saw(position, True)
        if rejected:
            self._saw(accepted, False)

    def _saw(self, position: int, kept: bool) -> None:
        """One proposal at `position` of its pass checked (or watched), and whether kept."""
        counts = self.first if position == 0 else self.further
        counts[0] += 1
        counts[1] += kept

    def took(self, tokens: Sequence[int]) -> None:
        """The tokens a pass gave: the counts fade by 2^(-len / HALF_LIFE); a watched
        proposal is followed token by token, each a proposal kept or (where the text leaves it)
        turned down, and the gate opens as soon as proposing pays (the next pass proposes from
        there, where the copy goes on)."""
        self.tokens += len(tokens)
        fade = 0.5 ** (len(tokens) / HALF_LIFE)
        for counts in (self.first, self.further):
            counts[0] *= fade
            counts[1] *= fade
        for token in tokens:
            if self.watched is None:
                break
            kept = token == self.watched[self.followed]
            self._saw(self.followed, kept)
            self.followed += 1
            self.paused = not self.pays()
            if not kept or self.followed == len(self.watched) or not self.paused:
                self.watched = None

    def line(self) -> str:
        """'speculative decoding: 68 of 94 proposed tokens kept in 7 checks; 96 tokens in 27
        passes': what it did (what `sheepop generate` says on stderr)."""
        return (f"speculative decoding: {self.accepted:,} of {self.proposed:,} proposed tokens "
                f"kept in {self.passes:,} checks; {self.tokens:,} tokens in "
                f"{self.steps:,} passes")


def check_pass(lm: ProposalChecker, ids: Sequence[int], k: int, gate: Gate,
               take: Callable[[np.ndarray, int | None], tuple[int, bool]]) -> int:
    """One forward pass of speculative decoding after `ids`, whose last token `lm`'s cache
    does not hold yet: up to k proposals (none while `gate` is closed, or none found: a plain
    decode step, the fastest kind of pass) checked together. take(z_j, d_{j+1}) turns
    position j's logits into its token given the proposal there (None past the last) and says
    whether the sequence has ended; the positions are walked in order until a token differs
    from its proposal or the sequence ends, the rest rolled back, so the cache then holds
    every kept token but the newest. Returns the number of tokens taken (1 .. k + 1).

    This is the one place the pass is made: `speculated` (sheepop generate and chat) and the
    server's lone running sequence (sheepop.serve.api.scheduler) both call it."""
    draft = propose(ids, gate.proposals(k))
    if gate.watching():  # paused: what it would have checked, judged by the tokens to come
        gate.watch(propose(ids, k))
    rows = lm.verify([ids[-1]] + draft) if draft else lm.decode(ids[-1])[None]
    tokens = []
    for j, z in enumerate(rows):
        proposed = draft[j] if j < len(draft) else None
        token, ended = take(z, proposed)
        tokens.append(token)
        if token != proposed or ended:
            lm.rollback(len(draft) - j)  # the cache keeps ids but the newest token
            if draft:
                gate.record(len(draft), j + (token == proposed),
                            token != proposed and j < len(draft))
            gate.took(tokens)
            gate.steps += 1
            return j + 1
    raise AssertionError("the last position has no proposal: it always ends the pass")


def speculated(lm: CheckingLanguageModel, ids: list[int], cfg: SampleConfig,
               rng: np.random.Generator, seen: np.ndarray | None, never: Sequence[int],
               constraint: ConstraintState | None, eos_id: int | None, budget: int,
               gate: Gate, want_probs: bool = False) -> Iterator[tuple[int, np.ndarray | None]]:
    """(token, its distribution) after `ids`, whose last token `lm`'s cache does not hold yet,
    `cfg.speculate` proposals a pass (`check_pass`); each token is appended to `ids`,
    `seen` and `constraint` take it. Ends after `budget` tokens, `eos_id`, or when the cache
    has no room for another pass (`lm.room()` 0: the context is full, or the cache cannot
    roll back); the cache then holds all of `ids` but the last, as it did at the start."""
    done = 0
    taken: list[tuple[int, np.ndarray | None]] = []  # this pass's tokens

    def take(z: np.ndarray, proposed: int | None) -> tuple[int, bool]:
        check_finite(z)
        allowed = None if constraint is None else constraint.allowed(z.shape[-1])
        z = filtered_logits(z, seen, cfg.repetition_penalty, never, allowed)
        token, shown = judge(z, cfg, rng, proposed, want_probs)
        if constraint is not None:
            constraint.advance(token)
        if seen is not None:
            seen[token] = True
        ids.append(token)
        taken.append((token, shown))
        return token, token == eos_id or done + len(taken) == budget

    while done < budget:
        room = lm.room()
        if room < 1:
            return
        check_pass(lm, ids, min(cfg.speculate, room - 1, budget - done - 1), gate, take)
        yield from taken  # (one pass computed them all: they are yielded together)
        done += len(taken)
        if taken[-1][0] == eos_id:
            return
        taken.clear()
