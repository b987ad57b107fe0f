"""The continuous-batching loop: one thread owns the model and everything it computes.

Requests arrive from the event loop (`submit`) into a bounded queue of choices; the thread, in a
loop (docs/serve.md, "Continuous batching"):

1. drops the running choices whose request was cancelled (client gone) or ran past its deadline:
   their rows leave the batch at once;
2. admits waiting choices into the free rows, FIFO; each prompt's prefill starts from the
   longest prefix of it the prefix cache holds (sheepop.generation.prefix_cache);
3. computes a chunk of the admitted prompts, in order (sheepop.serve.api.joining: by default
   as many tokens as keep the iteration within twice a decode step's time; whole prompts while
   nothing runs), in the same forward pass as step 4's decode step (`_mixed`,
   sheepop.arch.packed), or in a pass of its own before it where the model cannot mix them: a
   prompt whose last token is computed joins the batch and draws its first token (the time to
   first token), so a long prompt stalls the running ones by one chunk per step, never by its
   whole prefill;
4. runs one decode step for every running choice: each gets one token (a choice running alone
   whose request speculates gets up to k + 1: its k proposed tokens checked in the same pass,
   sheepop.generation.speculative);
5. lets the finished ones leave (their tokens' whole blocks go into the prefix cache), and hands
   the iteration's events to the app in one call.

Nothing waits for the batch to drain: a choice joins at the step after its prefill and leaves at
the step it ends. The rows are `Lanes` of `RunningBatch`es (sheepop.generation.lanes,
running_batch), so each row keeps its own positions and keys, a long one in a lane of its own
columns, and a choice gets the same tokens alone or among others.

Other work on the model (e.g. inspecting it) goes through `call`, which runs a function on this
thread between two steps: the model is never used from two threads.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from sheepop.generation.lanes import Lanes
from sheepop.generation.prefill import Prefill
from sheepop.generation.prefix_cache import PrefixCache
from sheepop.inference.load import InferenceModel
from sheepop.serve.api.choice import Choice, Event, Job, prompt_logprobs
from sheepop.serve.api.joining import RATIO, Joining
from sheepop.serve.api.protocol import ApiError

Delivery = Callable[[list[tuple[Job, list[Event]]]], None]


class QueueFull(Exception):
    pass


def timed_out(timeout: float) -> ApiError:
    return ApiError(504, f"the request ran past this server's timeout ({timeout:g} s)",
                    type="timeout", code="timeout")


SHUTTING_DOWN = ApiError(503, "the server is shutting down", type="server_error",
                         code="shutting_down")


class Scheduler:
    def __init__(self, model: InferenceModel, max_batch: int, max_queue: int,
                 timeout: float, prefill_chunk: int = 0, cache_bytes: int = 0,
                 prefill_budget: float = RATIO):
        self.model = model
        self.lm = model.lm
        self.never = list(self.lm.never_generate)
        self.max_batch, self.max_queue, self.timeout = max_batch, max_queue, timeout
        self.batch = Lanes(self.lm, max_batch)
        self.prefix = PrefixCache(cache_bytes)
        self.joining = Joining(self.lm, self.prefix, prefill_chunk, prefill_budget)
        self.running: list[Choice] = []  # row r of the batch (its lanes') is running[r]
        self.waiting: deque[Choice] = deque()
        self.calls: deque[tuple[Callable[[InferenceModel], Any], Future]] = deque()
        self.cond = threading.Condition()
        self.stopping = False
        self.thread: threading.Thread | None = None
        self.deliver: Delivery = lambda batch: None
        self.out: dict[Job, list[Event]] = {}
        self.stats = {"steps": 0, "tokens": 0, "prefills": 0, "decode_s": 0.0,
                      "prefill_s": 0.0, "cancelled": 0, "peak_running": 0,
                      "kv_cache_peak_bytes": 0, "prefill_chunks": 0,
                      "mixed_steps": 0, "mixed_s": 0.0,
                      "proposed_tokens": 0, "accepted_tokens": 0}
        self.logged_prompts = 0  # prompts when the prefix cache's hit rate was last logged

    # ----- the event loop's side ---------------------------------------------------------------
    def start(self, deliver: Delivery) -> None:
        self.deliver = deliver
        self.thread = threading.Thread(target=self._loop, name="sheepop-scheduler", daemon=True)
        self.thread.start()

    def submit(self, job: Job) -> None:
        """Queue the job's choices; QueueFull when the queue cannot take them all."""
        with self.cond:
            if self.stopping:
                raise QueueFull
            if len(self.waiting) + len(job.choices) > self.max_queue:
                raise QueueFull
            self.waiting.extend(job.choices)
            self.cond.notify()

    def cancel(self, job: Job, reason: str = "cancelled") -> None:
        """Stop the job's choices: their rows leave at the next iteration (no event is sent)."""
        if job.cancelled is None and any(c.finish is None for c in job.choices):
            job.cancelled = reason
            with self.cond:
                self.cond.notify()

    def call(self, fn: Callable[[InferenceModel], Any]) -> Future:
        """Run fn(model) on the model's thread between two steps; its result as a Future."""
        future: Future = Future()
        with self.cond:
            self.calls.append((fn, future))
            self.cond.notify()
        return future

    def status(self) -> dict[str, Any]:
        """The counters (GET /health): `kv_cache_bytes` is what the running batch's KV cache
        holds now (it follows the tokens in flight), `kv_cache_peak_bytes` the most so far."""
        return {"running": len(self.running), "waiting": len(self.waiting),
                "max_batch": self.max_batch, "max_queue": self.max_queue,
                "kv_cache_bytes": self.batch.nbytes, "joining": self.joining.rows,
                **self.stats, **self.prefix.status()}

    def stop(self) -> None:
        """Cancel what is left (the app has let the running requests finish until its
        deadline) and end the thread."""
        with self.cond:
            self.stopping = True
            self.cond.notify()
        if self.thread is not None:
            self.thread.join()

    # ----- the model's thread ------------------------------------------------------------------
    def _loop(self) -> None:
        while (work := self._wait_for_work()) is not None:
            calls, admitted = work
            for fn, future in calls:
                self._run_call(fn, future)
            self._drop_cancelled()
            self._generate(admitted)
            self._flush()
        self._shutdown()

    def _wait_for_work(self) -> tuple[list, list[Choice]] | None:
        """Asleep until there is something to do; then the calls to run and the choices
        admitted to the batch (None: the server is stopping)."""
        with self.cond:
            while not (self.waiting or self.running or self.joining or self.calls
                       or self.stopping):
                self.cond.wait()
            if self.stopping:
                return None
            calls, self.calls = list(self.calls), deque()
            return calls, self._admit()

    def _generate(self, admitted: list[Choice]) -> None:
        """One iteration: a chunk of the admitted prompts and one token for every running
        choice, in one pass where the model can mix them, else the chunk first."""
        try:
            self.joining.add(admitted)
            # (a chunk sized by cost needs a step measured at about these rows: a plain one)
            ready = not self.running or self.joining.ready(len(self.running))
            if self.joining and self.running and ready and self._mixes():
                self._mixed()
                return
            t0, chunked = time.perf_counter(), bool(self.joining and self.running and ready)
            if self.joining and ready:
                self._join()
            if self.running:  # (each row steered as its request asks)
                with self.lm.steered_rows([c.job.request.steering for c in self.running]):
                    self._step()
            if chunked:  # (a chunk sized by cost: the iteration's time, its pass and the step)
                self.joining.measured(iteration_s=time.perf_counter() - t0)
        except Exception:  # a bug, or out of memory: fail those requests, keep serving
            traceback.print_exc(file=sys.stderr)
            self._fail_all(ApiError(500, "internal error while generating", type="server_error"))

    def _admit(self) -> list[Choice]:
        """Waiting choices for the rows neither running nor reserved by a joining prompt, FIFO
        (under the lock); cancelled and expired ones are dropped on the way."""
        now, taken = time.monotonic(), []
        if any([self._gone(c, now) for c in self.waiting]):  # (a list: every one is checked)
            self.waiting = deque(c for c in self.waiting if c.finish is None)
        while self.waiting and len(taken) < self.batch.free - self.joining.rows:
            taken.append(self.waiting.popleft())
        return taken

    def _gone(self, c: Choice, now: float) -> bool:
        """Whether a choice must stop: cancelled (nothing to say) or expired (an error)."""
        job = c.job
        if job.cancelled is None and now > job.deadline:
            job.cancelled = "timeout"
        if job.cancelled is None:
            return False
        if c.finish is None:
            c.finish = job.cancelled
            self.stats["cancelled"] += 1
            if job.cancelled == "timeout":
                self._emit(job, Event(c.index, error=timed_out(self.timeout)))
        return True

    def _drop_cancelled(self) -> None:
        now = time.monotonic()
        self.joining.drop(lambda c: self._gone(c, now))
        self._leave([r for r, c in enumerate(self.running) if self._gone(c, now)])

    def _leave(self, rows: list[int]) -> None:
        if rows:
            for r in rows:  # a sequence that ended well: its blocks for later prompts
                c = self.running[r]
                if c.finish in ("stop", "length") and c.job.request.steering is None:
                    k, v = self.batch.row_keys(r)
                    self.prefix.store((c.prompt + c.tokens)[:k.shape[2]], k, v)
            order = self.batch.leave(rows)
            self.running = [self.running[i] for i in order]

    def _mixes(self) -> bool:
        """Whether this iteration's chunk may go in the decode step's pass: the model mixes
        sequences (CachedLM.mixes), no lone sequence speculates (its pass checks several
        tokens of one row) and the chunk asked for fits in one pass (Joining.mixable)."""
        return self.lm.mixes and self.joining.mixable and self._speculating() is None

    def _mixed(self) -> None:
        """One pass: a decode step for every running choice and this iteration's chunk of the
        joining prompts (RunningBatch.step with chunks); then each prompt done joins the
        batch and its first tokens are sent."""
        t0 = time.perf_counter()
        chunks = self.joining.plan(self.joining.budget(running=True, mixed=True))
        steering = [c.job.request.steering for c in self.running] + [p.steering for p, _ in chunks]
        with self.lm.steered_rows(steering):  # (each row as its request asks)
            logits = self.batch.step([c.last for c in self.running], chunks)
        for c, row in zip(self.running, logits):
            self._emit(c.job, c.take(row, self.never))
        self.stats["tokens"] += len(self.running)
        self._stepped()
        self.stats["prefill_chunks"] += 1
        self.stats["mixed_steps"] += 1
        self.stats["mixed_s"] += time.perf_counter() - t0
        self.joining.measured(iteration_s=time.perf_counter() - t0)
        self._leave([r for r, c in enumerate(self.running) if c.finish is not None])
        for copies, prefill in self.joining.joined():
            self._joined(copies, prefill)

    def _join(self) -> None:
        """Compute this iteration's chunk of the joining prompts in passes of their own; each
        one done joins the batch and its first tokens are sent at once."""
        t0 = time.perf_counter()
        for copies, prefill in self.joining.advance(self.joining.budget(bool(self.running))):
            self._joined(copies, prefill)
        self.stats["prefill_chunks"] += 1
        self.stats["prefill_s"] += time.perf_counter() - t0

    def _joined(self, copies: list[Choice], prefill: Prefill) -> None:
        """A finished prompt joins the batch (its copies as rows of its own cache, in the lane
        that costs least) and its first tokens are sent at once."""
        first = self.batch.place(prefill, len(copies))
        self._first_tokens(copies, prefill.logits)
        self.running[first:first] = copies
        self.stats["prefills"] += 1
        self._leave([r for r, c in enumerate(self.running) if c.finish is not None])
        self._flush()
        self._log_hits()

    def _log_hits(self, every: int = 100) -> None:
        """One line on stderr per `every` prompts: how much of them the prefix cache held."""
        p = self.prefix
        if p.usable and self.stats["prefills"] >= self.logged_prompts + every:
            self.logged_prompts = self.stats["prefills"]
            s = p.status()
            print(f"sheepop: prefix cache: {s['cached_tokens']:,} of {s['prompt_tokens']:,} "
                  f"prompt tokens reused ({100 * s['prefix_cache_hit_rate']:.1f}%), "
                  f"{p.nbytes / 2**20:,.1f} of {p.max_bytes / 2**20:,.0f} MiB held, "
                  f"{p.evicted:,} blocks evicted", file=sys.stderr, flush=True)

    def _first_tokens(self, copies: list[Choice], row: Any) -> None:
        """Each copy of one prompt draws its first token from the prompt's last logits (and
        echoes the prompt's log-probabilities, computed once)."""
        echo = self._echo(copies[0])
        for c in copies:
            event = c.take(row, self.never)
            event.prompt_logprobs = echo
            self._emit(c.job, event)

    def _echo(self, c: Choice) -> list | None:
        r = c.job.request
        if not (r.echo and r.logprobs is not None):
            return None
        with self.lm.steered_rows([r.steering]):
            logits = self.lm.prompt_logits(c.prompt)
        return prompt_logprobs(logits, c.prompt, self.never, r.logprobs)

    def _speculating(self) -> Choice | None:
        """The choice running alone whose request speculates, where the batch has room."""
        lone = self.running[0] if len(self.running) == 1 else None
        if lone is not None and lone.gate is not None and self.batch.room() > 1:
            return lone
        return None

    def _step(self) -> None:
        t0 = time.perf_counter()
        lone = self._speculating()
        if lone is not None:
            proposed, accepted = lone.gate.proposed, lone.gate.accepted
            for event in lone.speculate(self.batch, self.never):
                self._emit(lone.job, event)
                self.stats["tokens"] += 1
            self.stats["proposed_tokens"] += lone.gate.proposed - proposed
            self.stats["accepted_tokens"] += lone.gate.accepted - accepted
        else:
            logits = self.batch.step([c.last for c in self.running])
            for c, row in zip(self.running, logits):
                self._emit(c.job, c.take(row, self.never))
            self.stats["tokens"] += len(self.running)
        self._stepped()
        self.stats["steps"] += 1
        self.stats["decode_s"] += time.perf_counter() - t0
        self.joining.measured(step_s=time.perf_counter() - t0, rows=len(self.running))
        self._leave([r for r, c in enumerate(self.running) if c.finish is not None])

    def _stepped(self) -> None:
        """The peak counters after a decode step."""
        self.stats["peak_running"] = max(self.stats["peak_running"], len(self.running))
        self.stats["kv_cache_peak_bytes"] = max(self.stats["kv_cache_peak_bytes"],
                                                self.batch.peak_bytes)

    def _run_call(self, fn: Callable[[InferenceModel], Any], future: Future) -> None:
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(fn(self.model))
            except Exception as e:
                future.set_exception(e)

    # ----- events ------------------------------------------------------------------------------
    def _emit(self, job: Job, event: Event) -> None:
        self.out.setdefault(job, []).append(event)

    def _flush(self) -> None:
        if self.out:
            batch, self.out = list(self.out.items()), {}
            try:
                self.deliver(batch)
            except RuntimeError:  # the event loop has closed: nobody is listening any more
                pass

    def _fail_all(self, error: ApiError) -> None:
        for c in self.running + self.joining.clear():
            if c.finish is None:
                c.finish = "error"
                self._emit(c.job, Event(c.index, error=error))
        self.running = []
        self.batch = Lanes(self.lm, self.max_batch)  # its state may be torn

    def _shutdown(self) -> None:
        with self.cond:
            left, self.waiting = list(self.waiting), deque()
            calls, self.calls = list(self.calls), deque()
        for c in left:
            if c.finish is None and c.job.cancelled is None:
                self._emit(c.job, Event(c.index, error=SHUTTING_DOWN))
        self._fail_all(SHUTTING_DOWN)
        for _, future in calls:
            future.cancel()
        self._flush()
