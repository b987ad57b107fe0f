"""docs/serve.md's `openai` block runs as printed against one server (issue 32: it named two
models, `mine` and `chat`, that no single server serves)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

from serve_helpers import KEY

DOC = Path(__file__).resolve().parents[2] / "docs" / "serve.md"


def test_the_openai_block_of_serve_md_runs_against_one_server(server):
    block = re.search(r"The `openai` Python package.*?```python\n(.*?)```", DOC.read_text(),
                      re.S).group(1)
    assert set(re.findall(r'model="(\w+)"', block)) == {"chat"}  # one server serves it all
    # The server of these tests: the chat run, named by its directory ("chat"), its own key.
    code = (block.replace("http://127.0.0.1:8000/v1", server.url + "/v1")
            .replace('api_key="sk-local"', f'api_key="{KEY}"'))
    assert code != block
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(DOC), "exec"), {})  # noqa: S102 - our own documentation
    assert out.getvalue().strip()  # a completion, then the streamed answer
