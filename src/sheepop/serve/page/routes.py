"""The page at `/` of `sheepop serve`: generate, look inside, follow runs (docs/page.md).

    GET /                       static/index.html
    GET /static/{file}          its scripts and style, written here (no CDN, no framework)
    GET /docs/math/{page}.md    the mathematics each view links to, rendered, its formulas in
                                MathML (sheepop.serve.documents.routes; also docs/derivations/)

`routes(run_dir, runs_dir)` gives every route of the page and of its data (the views' modules
beside this one: inside_view, step_view, backprop_view, runs_view), for
`create_app(model, settings, routes)` (sheepop.serve.api.app).
"""

from __future__ import annotations

from pathlib import Path

from starlette.requests import Request as HttpRequest
from starlette.responses import FileResponse
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from sheepop.serve.documents import routes as documents
from sheepop.serve.page import backprop_view, inside_view, patch_view, runs_view, step_view

STATIC = Path(__file__).with_name("static")


async def index(request: HttpRequest) -> FileResponse:
    return FileResponse(STATIC / "index.html", headers={"cache-control": "no-cache"})


def routes(run_dir: str | Path | None, runs_dir: str | Path | None = None) -> list[BaseRoute]:
    """The page, its static files, /v1/inspect and /v1/runs over the served run and the runs
    under `runs_dir`."""
    return [Route("/", index, methods=["GET"]),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
            *documents.ROUTES,
            *inside_view.ROUTES,
            *step_view.ROUTES, *backprop_view.ROUTES,  # the Step and Backprop views (issue 30)
            *patch_view.ROUTES,  # activation patching (issue 46)
            *runs_view.routes(None if run_dir is None else Path(run_dir),
                         None if runs_dir is None else Path(runs_dir))]
