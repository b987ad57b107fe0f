"""The page at `/` of `sheepop serve`: generate, look inside, follow runs (docs/page.md).

    GET /                       static/index.html
    GET /static/{file}          its scripts and style, written here (no CDN, no framework)
    GET /docs/math/{page}.md    the mathematics each view links to, as text, when sheepop runs
                                from a source checkout (an installed package holds no docs/)

`routes(run_dir, runs_dir)` gives every route of the page and of its data (sheepop.serve.inspect,
sheepop.serve.runs), for `create_app(model, settings, routes)`.
"""

from __future__ import annotations

import re
from pathlib import Path

from starlette.requests import Request as HttpRequest
from starlette.responses import FileResponse, PlainTextResponse
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from sheepop.serve import backward, inspect, runs, trace
from sheepop.serve.protocol import ApiError

STATIC = Path(__file__).with_name("static")
MATH_DOCS = Path(__file__).resolve().parents[3] / "docs" / "math"
PAGE_NAME = re.compile(r"[0-9a-z][0-9a-z-]*\.md")


async def index(request: HttpRequest) -> FileResponse:
    return FileResponse(STATIC / "index.html", headers={"cache-control": "no-cache"})


async def math_page(request: HttpRequest) -> PlainTextResponse:
    name = request.path_params["page"]
    path = MATH_DOCS / name
    if not PAGE_NAME.fullmatch(name) or not path.is_file():
        raise ApiError(404, f"no page docs/math/{name[:80]} here: the documents come with a "
                            "source checkout of sheepop (docs/math/)", code="not_found")
    return PlainTextResponse(path.read_text(encoding="utf-8"),
                             media_type="text/markdown; charset=utf-8")


def routes(run_dir: str | Path | None, runs_dir: str | Path | None = None) -> list[BaseRoute]:
    """The page, its static files, /v1/inspect and /v1/runs over the served run and the runs
    under `runs_dir`."""
    return [Route("/", index, methods=["GET"]),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
            Route("/docs/math/{page}", math_page, methods=["GET"]),
            *inspect.ROUTES,
            *trace.ROUTES, *backward.ROUTES,  # the Step and Backprop views (issue 30)
            *runs.routes(None if run_dir is None else Path(run_dir),
                         None if runs_dir is None else Path(runs_dir))]
