"""The ASGI application: OpenAI's routes over one `Scheduler` (docs/serve.md).

    POST /v1/completions, /v1/chat/completions   generation, whole or streamed (server-sent
                                                 events ending in `data: [DONE]`)
    GET  /v1/models, /v1/models/{id}             the one model served
    GET  /health                                 liveness and the scheduler's counters

`create_app(model, settings, routes)` builds it; other modules add their routes through
`routes` and reach the model through `app.state` (`scheduler.call(fn)` runs fn(model) on the
model's thread). Every error, from a route or from Starlette itself (404, 405), is OpenAI's JSON
shape; a request's mistakes never reach the scheduler, so the server keeps serving.

Only the server's own page, and clients that are not browsers, may call it (`SameOrigin`): a
request whose Host is not this server's (DNS rebinding) or whose Origin is another site's is
refused with 403 before anything else, unless `Settings.allow_origins` names that origin.

A generation request becomes a `Job` in the scheduler's queue (503 with Retry-After when full);
its response (`JobResponse`) reads the job's events as they come and listens for the client's
disconnection meanwhile: a client that goes away cancels its job, whose rows leave the batch at
the scheduler's next iteration.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import re
import time
from collections.abc import Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from sheepop.inference.load import InferenceModel
from sheepop.serve.api.choice import Event, Job
from sheepop.serve.api.joining import RATIO
from sheepop.serve.api.json_out import MAX_NESTING, nesting
from sheepop.serve.api.origin import SameOrigin
from sheepop.serve.api.protocol import ApiError, Served, bad, parse
from sheepop.serve.api.respond import JobResponse
from sheepop.serve.api.response_shapes import Render, TokenTexts
from sheepop.serve.api.scheduler import QueueFull, Scheduler

# Answered without the API key: a liveness probe and the page's own files hold no secret (the
# page asks for the key and sends it with every call to the API).
OPEN_PATHS = ("/health", "/")
OPEN_PREFIXES = ("/static/", "/docs/")


@dataclass
class Settings:
    name: str                      # the model's id in the API
    api_key: str | None = None     # every other request needs "Authorization: Bearer KEY"
    host: str = "127.0.0.1"        # the address bound: the Host a request may name (or localhost)
    allow_origins: tuple[str, ...] = ()  # other sites' pages that may call (CORS), "http://h:p"
    max_batch: int = 16            # sequences decoding together
    max_queue: int = 256           # choices waiting for a row (more: 503)
    timeout: float = 600.0         # seconds from arrival to the last token (more: 504)
    max_body: int = 1 << 20        # bytes of a request body (more: 413)
    prefill_chunk: int = 0         # prompt tokens computed per iteration (0: by cost)
    prefill_budget: float = RATIO  # ... by cost: an iteration up to this many decode steps' time
    cache_mb: float = 1024         # MiB of keys and values kept for prompt reuse (0: none)
    vectors: dict[str, Any] = field(default_factory=dict)  # steering vectors a request names


def error_response(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), e.status, headers=e.headers)


async def _api_error(request: HttpRequest, e: Exception) -> JSONResponse:
    assert isinstance(e, ApiError)
    return error_response(e)


async def _http_error(request: HttpRequest, e: Exception) -> JSONResponse:
    assert isinstance(e, HTTPException)
    kind = "not_found" if e.status_code == 404 else None
    message = f"{request.method} {request.url.path}: {e.detail}"
    return error_response(ApiError(e.status_code, message, code=kind,
                                   headers=dict(e.headers or {})))


async def _bug(request: HttpRequest, e: Exception) -> JSONResponse:
    return error_response(ApiError(500, "internal server error", type="server_error"))


class RequireKey:
    """Refuses (401) every request without "Authorization: Bearer KEY", but OPEN_PATHS and
    the files under OPEN_PREFIXES."""

    def __init__(self, app: ASGIApp, key: str):
        self.app, self.expected = app, f"Bearer {key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and path not in OPEN_PATHS \
                and not path.startswith(OPEN_PREFIXES):
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                e = ApiError(401, "Incorrect API key provided: give it as 'Authorization: "
                                  "Bearer KEY'", code="invalid_api_key")
                await error_response(e)(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def read_json(request: HttpRequest, limit: int) -> Any:
    """The request's JSON body; 413 past `limit` bytes (before reading, when it says so), 400
    when it is not JSON or nests deeper than MAX_NESTING."""
    too_big = ApiError(413, f"the request body is larger than this server's limit of {limit} "
                            "bytes", code="request_too_large")
    declared = request.headers.get("content-length", "")
    if re.fullmatch(r"[0-9]{1,20}", declared) and int(declared) > limit:
        raise too_big
    data = bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) > limit:
            raise too_big
    too_deep = bad(None, f"the request body nests arrays and objects deeper than "
                         f"{MAX_NESTING} levels")
    try:
        body = json.loads(data)
    except RecursionError:  # (thousands of nested brackets: deeper than the stack)
        raise too_deep from None
    except ValueError as e:
        raise bad(None, f"the request body is not valid JSON: {e}") from None
    if nesting(body) > MAX_NESTING:
        raise too_deep
    return body


# ----- routes ------------------------------------------------------------------------------------

async def _generate(request: HttpRequest, chat: bool) -> JobResponse:
    st = request.app.state
    body = await read_json(request, st.settings.max_body)
    # (off the event loop: a chat template renders here, for up to its bound of seconds)
    req = await asyncio.to_thread(parse, body, st.served, chat)
    job = Job(req, st.model.tokenizer, st.settings.timeout)
    job.inbox = asyncio.Queue()
    try:
        st.scheduler.submit(job)
    except QueueFull:
        raise ApiError(503, "the server is busy: its queue is full; try again shortly",
                       type="server_error", code="queue_full",
                       headers={"Retry-After": "1"}) from None
    return JobResponse(st.scheduler, job, Render(req, st.texts, st.settings.name))


async def completions(request: HttpRequest) -> JobResponse:
    return await _generate(request, chat=False)


async def chat_completions(request: HttpRequest) -> JobResponse:
    return await _generate(request, chat=True)


def _model_card(request: HttpRequest) -> dict[str, Any]:
    st = request.app.state
    return {"id": st.settings.name, "object": "model", "created": st.created,
            "owned_by": "sheepop", "context_length": st.served.context}


async def models(request: HttpRequest) -> JSONResponse:
    return JSONResponse({"object": "list", "data": [_model_card(request)]})


async def model(request: HttpRequest) -> JSONResponse:
    if request.path_params["model"] != request.app.state.settings.name:
        raise ApiError(404, f"the model '{request.path_params['model']}' does not exist",
                       param="model", code="model_not_found")
    return JSONResponse(_model_card(request))


async def health(request: HttpRequest) -> JSONResponse:
    st = request.app.state
    return JSONResponse({"status": "ok", "model": st.settings.name, **st.scheduler.status()})


ROUTES = [
    Route("/v1/completions", completions, methods=["POST"]),
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    Route("/v1/models", models, methods=["GET"]),
    Route("/v1/models/{model:path}", model, methods=["GET"]),
    Route("/health", health, methods=["GET"]),
]


def _deliver_to(loop: asyncio.AbstractEventLoop):
    """The scheduler's delivery: one hop to the event loop per iteration, then each job's
    events into its inbox."""
    def fan_out(batch: list[tuple[Job, list[Event]]]) -> None:
        for job, events in batch:
            job.inbox.put_nowait(events)

    return lambda batch: loop.call_soon_threadsafe(fan_out, batch)


def create_app(model: InferenceModel, settings: Settings, routes: Sequence[BaseRoute] = ()
               ) -> Starlette:
    """The server's ASGI app for `model`; `routes` are added after OpenAI's."""
    scheduler = Scheduler(model, settings.max_batch, settings.max_queue, settings.timeout,
                          settings.prefill_chunk, int(settings.cache_mb * 2**20),
                          settings.prefill_budget)

    @asynccontextmanager
    async def lifespan(app: Starlette):
        scheduler.start(_deliver_to(asyncio.get_running_loop()))
        yield
        await asyncio.to_thread(scheduler.stop)

    middleware = [Middleware(SameOrigin, host=settings.host, origins=settings.allow_origins)]
    if settings.api_key:
        middleware.append(Middleware(RequireKey, key=settings.api_key))
    app = Starlette(routes=[*ROUTES, *routes], middleware=middleware, lifespan=lifespan,
                    exception_handlers={ApiError: _api_error, HTTPException: _http_error,
                                        Exception: _bug})
    app.state.model, app.state.settings, app.state.scheduler = model, settings, scheduler
    app.state.created = int(time.time())
    app.state.texts = TokenTexts(model.tokenizer)
    app.state.served = Served(settings.name, model.tokenizer, model.config.model.block_size,
                              model.config.sample, settings.max_queue, settings.vectors)
    return app
