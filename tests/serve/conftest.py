"""The runs and the servers the server's tests share (started once, stopped at the end)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from chromium import launch
from serve_helpers import KEY, ServerProcess, make_runs

from sheepop.inference.load import load


@pytest.fixture(autouse=True)
def torch_on_one_thread(one_torch_thread):
    """Every test here runs torch on one thread (why: tests/conftest.py, `one_torch_thread`)."""


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium for a module's browser tests (skipped without Playwright)."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    with sync_api.sync_playwright() as p:
        b = launch(p)
        yield b
        b.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    """Where the browser tests' screenshots go: $SHEEPOP_PAGE_SHOTS, or a temporary folder."""
    where = os.environ.get("SHEEPOP_PAGE_SHOTS")
    path = Path(where) if where else tmp_path_factory.mktemp("shots")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def runs(tmp_path_factory):
    """(chat run: sinusoidal positions, the chat template; plain run: rope, no template)."""
    return make_runs(tmp_path_factory.mktemp("serve"))


@pytest.fixture(scope="session")
def server(runs):
    """The chat run, torch engine, an API key, batches of up to 16."""
    s = ServerProcess(runs[0], "--engine", "torch", "--api-key", KEY, "--max-batch", "16")
    yield s
    assert s.stop(signal.SIGTERM) == 0


@pytest.fixture(scope="session")
def plain_server(runs):
    """The run without a chat template, NumPy engine, no API key."""
    s = ServerProcess(runs[1], "--engine", "numpy", "--max-batch", "4")
    yield s
    assert s.stop(signal.SIGINT) == 0


@pytest.fixture(scope="session")
def chat_model(runs):
    return load(runs[0], "torch")


@pytest.fixture(scope="session")
def plain_model(runs):
    return load(runs[1], "numpy")
