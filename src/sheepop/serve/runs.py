"""`/v1/runs`: the training curves of run directories, for the page's runs view (docs/page.md).

    GET /v1/runs                       the runs: the served one, and every directory holding a
                                       metrics.jsonl under `sheepop serve --runs DIR` (two levels
                                       deep at most; symbolic links are not followed)
    GET /v1/runs/{name}/metrics?since=N   the rows of its metrics.jsonl from row N on, and
                                       `total`, the rows it holds now: polling with since=total
                                       reads only what a training run appended meanwhile

A row is what the trainer wrote (step, loss, lr, val_loss, val_bpb, ...); a line torn by a crash,
or still being written, is skipped. A resumed run rewrites its file shorter: `since` past the end
answers every row again with `"reset": true`. A name is looked up among the listed runs, never
joined onto a path, so no request reads outside them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse
from starlette.routing import Route

from sheepop.serve.protocol import ApiError, bad

METRICS = "metrics.jsonl"
MAX_DEPTH = 2


def find_runs(served: Path | None, runs_dir: Path | None) -> dict[str, Path]:
    """name -> run directory: the served run (its directory's name) first, then the runs under
    `runs_dir` by their path relative to it."""
    found: dict[str, Path] = {}
    if served is not None:
        found[served.resolve().name] = served
    if runs_dir is None or not runs_dir.is_dir():
        return found
    level = [runs_dir]
    for _ in range(MAX_DEPTH):
        below = []
        for folder in level:
            try:
                children = sorted(p for p in folder.iterdir()
                                  if p.is_dir() and not p.is_symlink())
            except OSError:
                continue
            for child in children:
                if (child / METRICS).is_file():
                    name = child.relative_to(runs_dir).as_posix()
                    if served is None or child.resolve() != served.resolve():
                        found.setdefault(name, child)
                below.append(child)
        level = below
    return found


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The complete rows of a metrics.jsonl (a torn or unfinished line is skipped)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    rows = []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            rows.append(row)
    return rows


def _since(request: HttpRequest) -> int:
    raw = request.query_params.get("since", "0")
    if not raw.isdigit():
        raise bad("since", f"'since' must be a row number >= 0, not {raw[:20]!r}")
    return int(raw)


def routes(served: Path | None, runs_dir: Path | None) -> list[Route]:
    """The two routes, over the served run and the runs under `runs_dir`."""

    async def list_runs(request: HttpRequest) -> JSONResponse:
        runs = await anyio.to_thread.run_sync(find_runs, served, runs_dir)
        data = [{"name": name, "served": i == 0 and served is not None,
                 "metrics": (path / METRICS).is_file()}
                for i, (name, path) in enumerate(runs.items())]
        return JSONResponse({"object": "list", "data": data})

    async def metrics(request: HttpRequest) -> JSONResponse:
        name, since = request.path_params["name"], _since(request)
        runs = await anyio.to_thread.run_sync(find_runs, served, runs_dir)
        if name not in runs:
            raise ApiError(404, f"no run named {name[:80]!r} here (GET /v1/runs lists them)",
                           param="name", code="run_not_found")
        rows = await anyio.to_thread.run_sync(read_rows, runs[name] / METRICS)
        reset = since > len(rows)
        return JSONResponse({"object": "metrics", "run": name, "total": len(rows),
                             "since": 0 if reset else since, "reset": reset,
                             "rows": rows if reset else rows[since:]})

    return [Route("/v1/runs", list_runs, methods=["GET"]),
            Route("/v1/runs/{name:path}/metrics", metrics, methods=["GET"])]
