"""`sheepop serve --runs`: a metrics.jsonl row nested hundreds deep (short enough for the line
cap, shallow enough for Python's parser, too deep for its encoder) is skipped like a torn line,
not answered with a 500 and a traceback (issue 41, section 5)."""

from __future__ import annotations

import json

import pytest
from serve_helpers import InProcess, call

from sheepop.serve.api.json_out import MAX_NESTING
from sheepop.serve.page.routes import routes as page_routes


@pytest.fixture(scope="module")
def site(runs, chat_model, tmp_path_factory):
    runs_dir = tmp_path_factory.mktemp("deep-runs")
    s = InProcess(chat_model, routes=page_routes(runs[0], runs_dir))
    s.runs_dir = runs_dir
    yield s
    s.close()


@pytest.mark.parametrize("depth", [980, MAX_NESTING + 1])
def test_a_row_nested_too_deep_is_skipped(site, depth):
    run = site.runs_dir / f"deep-{depth}"
    run.mkdir()
    deep = '{"step": 1, "loss": ' + "[" * depth + "1" + "]" * depth + "}"
    assert len(deep) < 65536  # under the line cap
    inner = MAX_NESTING - 1  # inside the row's object: MAX_NESTING deep, the most served
    shallow = {"step": 2, "loss": 2.5, "nested": json.loads("[" * inner + "]" * inner)}
    (run / "metrics.jsonl").write_text('{"step": 0, "loss": 3.0}\n' + deep + "\n"
                                       + json.dumps(shallow) + "\n")
    reply = call(site.url, "GET", f"/v1/runs/deep-{depth}/metrics")
    assert reply.status == 200, reply.text[:300]
    got = reply.json()
    assert [r["step"] for r in got["rows"]] == [0, 2] and got["total"] == 2
    assert got["rows"][1] == shallow
