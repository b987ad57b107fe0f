"""The page at `/` of `sheepop serve`: generate, look inside, follow runs (docs/page.md).

    GET /                       static/index.html
    GET /static/{file}          its scripts and style, written here (no CDN, no framework)
    GET /docs/math/{page}.md    the mathematics each view links to, rendered, its formulas in
                                MathML (sheepop.serve.doc_pages; also docs/derivations/)

`routes(run_dir, runs_dir)` gives every route of the page and of its data (sheepop.serve.inspect,
sheepop.serve.runs), for `create_app(model, settings, routes)`.
"""

from __future__ import annotations

from pathlib import Path

from starlette.requests import Request as HttpRequest
from starlette.responses import FileResponse
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from sheepop.serve import backward, doc_pages, inspect, runs, trace

STATIC = Path(__file__).with_name("static")


async def index(request: HttpRequest) -> FileResponse:
    return FileResponse(STATIC / "index.html", headers={"cache-control": "no-cache"})


def routes(run_dir: str | Path | None, runs_dir: str | Path | None = None) -> list[BaseRoute]:
    """The page, its static files, /v1/inspect and /v1/runs over the served run and the runs
    under `runs_dir`."""
    return [Route("/", index, methods=["GET"]),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
            *doc_pages.ROUTES,
            *inspect.ROUTES,
            *trace.ROUTES, *backward.ROUTES,  # the Step and Backprop views (issue 30)
            *runs.routes(None if run_dir is None else Path(run_dir),
                         None if runs_dir is None else Path(runs_dir))]
