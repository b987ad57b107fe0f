"""The response to one generation request: its job's events as OpenAI's JSON, whole or streamed
as server-sent events, while listening for the client's disconnection (sheepop.serve.api.app)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from typing import Any

import anyio
from starlette.types import Receive, Scope, Send

from sheepop.serve.api.choice import Event, Job
from sheepop.serve.api.json_out import dumps
from sheepop.serve.api.response_shapes import Render
from sheepop.serve.api.scheduler import SHUTTING_DOWN, Scheduler


def _sse(data: Any) -> bytes:
    return b"data: " + dumps(data, compact=True) + b"\n\n"


async def _send_json(send: Send, body: Any, status: int = 200,
                     headers: dict[str, str] | None = None) -> None:
    data = dumps(body)
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
        *((k.lower().encode(), v.encode()) for k, v in (headers or {}).items())]})
    await send({"type": "http.response.body", "body": data})


class JobResponse:
    """The answer to one generation request: the whole JSON once every choice has ended, or a
    stream of chunks as tokens come; either way the job is cancelled if the client leaves."""

    def __init__(self, scheduler: Scheduler, job: Job, render: Render):
        self.scheduler, self.job, self.render = scheduler, job, render
        self.left = set(range(job.request.choices))  # choices not ended yet
        self.started = False  # whether the response's head was sent

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self._respond(receive, send)
        except asyncio.CancelledError:
            # From outside: uvicorn cancels what still runs at the shutdown deadline. Say so to
            # a client still listening, and end the response properly (uvicorn would log a
            # traceback for every stream otherwise).
            with contextlib.suppress(Exception):
                await self._closing(send)

    async def _respond(self, receive: Receive, send: Send) -> None:
        async with anyio.create_task_group() as group:
            async def watch() -> None:  # (the body was read: what comes now is a disconnect)
                while (await receive())["type"] != "http.disconnect":
                    pass
                self.scheduler.cancel(self.job, "disconnected")
                group.cancel_scope.cancel()

            group.start_soon(watch)
            try:
                if self.job.request.stream:
                    await self._stream(send)
                else:
                    await self._whole(send)
            except OSError:  # the client went away while we wrote
                pass
            finally:
                self.scheduler.cancel(self.job, "ended")  # (nothing left to cancel, usually)
                group.cancel_scope.cancel()

    async def _closing(self, send: Send) -> None:
        if not self.started:
            await _send_json(send, SHUTTING_DOWN.body(), SHUTTING_DOWN.status)
        else:
            await send({"type": "http.response.body", "more_body": False,
                        "body": _sse(SHUTTING_DOWN.body()) + b"data: [DONE]\n\n"})

    async def _events(self) -> list[Event]:
        events = await self.job.inbox.get()
        # (both set before its first event, on the model's thread)
        self.render.cached_tokens = self.job.cached_tokens
        self.render.prefill_chunks = self.job.prefill_chunks
        self.render.proposed, self.render.accepted, _ = self.job.proposals()  # (so far)
        for e in events:
            if e.token is not None:  # (the tokens usage counts)
                self.job.stopwatch.tick(e.at)
            if e.finish is not None or e.error is not None:
                self.left.discard(e.index)
        return events

    def _log(self) -> None:
        """One line on stderr per request answered: its tokens, as its usage counts them, its
        speed (sheepop.generation.speed; the time to first token counts the queue too), the
        prompt tokens the prefix cache held and, when it asked for speculative decoding, the
        share of proposed tokens kept (its acceptance rate)."""
        proposed, accepted, checks = self.job.proposals()
        kept = (f"; speculative decoding: {accepted:,} of {proposed:,} proposed tokens kept "
                f"({accepted / max(proposed, 1):.0%}) in {checks:,} checks"
                if self.job.request.sample.speculate else "")
        print(f"sheepop: {self.render.id}: {self.job.stopwatch.speed().line()}; "
              f"{self.job.cached_tokens} prompt tokens cached{kept}", file=sys.stderr,
              flush=True)

    async def _whole(self, send: Send) -> None:
        events: list[Event] = []
        while self.left:
            for e in await self._events():
                if e.error is not None:
                    self.started = True
                    await _send_json(send, e.error.body(), e.error.status, e.error.headers)
                    return
                events.append(e)
        self.started = True
        await _send_json(send, self.render.whole(events))
        self._log()

    def _chunks(self, events: list[Event], out: list[bytes]) -> bool:
        """The server-sent events of these events, appended to `out`; True after an error (an
        error mid-stream: OpenAI's error object, and nothing after it)."""
        for e in events:
            if e.error is not None:
                out.append(_sse(e.error.body()))
                return True
            chunk = self.render.chunk(e)
            if chunk is not None:
                out.append(_sse(chunk))
        return False

    async def _stream(self, send: Send) -> None:
        self.started = True
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]})
        out = [_sse(c) for c in self.render.opening()]
        failed = False
        while self.left and not failed:
            failed = self._chunks(await self._events(), out)
            if out:
                await send({"type": "http.response.body", "body": b"".join(out),
                            "more_body": True})
                out = []
        if self.job.request.include_usage and not failed:
            out.append(_sse(self.render.usage_chunk()))
        out.append(b"data: [DONE]\n\n")
        await send({"type": "http.response.body", "body": b"".join(out), "more_body": False})
        if not failed:
            self._log()
