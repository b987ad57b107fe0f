"""The endpoint of a view computed on the served model (step_view's /v1/trace, backprop_view's
/v1/backward, patch_view's /v1/patch): what each of them does around its own computation.

    1. read the request's JSON body (413 past the server's limit, 400 when it is not JSON:
       sheepop.serve.api.app.read_json), and refuse one that is not a JSON object (400);
    2. `prepare(body, model, text)`: the view checks its fields (4xx, naming the field) and gives
       its computation, a function of the model;
    3. run that on the scheduler's thread, between two decode steps (a UserError it raises is
       the request's mistake: 400);
    4. answer its JSON with the served model's name and the seconds the request took.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse

from sheepop.errors import UserError
from sheepop.inference.load import InferenceModel
from sheepop.serve.api.app import read_json
from sheepop.serve.api.json_out import FiniteJSONResponse
from sheepop.serve.api.protocol import bad

Text = Callable[[int], str]
"""A token id's text, as the server shows it."""
Computation = Callable[[InferenceModel], dict[str, Any]]
"""A view's work on the model, run on the scheduler's thread: its JSON answer."""
Prepare = Callable[[dict, InferenceModel, Text], Awaitable[Computation]]


def view_endpoint(prepare: Prepare) -> Callable[[HttpRequest], Awaitable[JSONResponse]]:
    """The POST endpoint of a view whose request `prepare` checks and turns into a
    computation (see the module's docstring)."""

    async def endpoint(request: HttpRequest) -> JSONResponse:
        st = request.app.state
        started = time.perf_counter()
        body = await read_json(request, st.settings.max_body)
        if not isinstance(body, dict):
            raise bad(None, "the request body must be a JSON object")
        compute = await prepare(body, st.model, lambda i: st.texts(i)[0])
        try:
            out = await asyncio.wrap_future(st.scheduler.call(compute))
        except UserError as e:
            raise bad(None, str(e)) from None
        out["model"] = st.settings.name
        out["seconds"] = round(time.perf_counter() - started, 4)
        return FiniteJSONResponse(out)

    return endpoint
