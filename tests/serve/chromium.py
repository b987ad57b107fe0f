"""Debian's Chromium through Playwright (no browser download), for the page's browser tests:
where it is, the mark that skips a test without it, the launch every test uses, and the page
every test opens (`opened`). The `browser` and `shots` fixtures that use them are in
tests/serve/conftest.py."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no chromium: `make system-deps` "
                                    "installs it (apt-get install chromium)")


def launch(playwright):
    """Headless Chromium from a running `sync_playwright()`."""
    return playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])


WAIT_MS = 20_000
"""How long a page's wait lasts before it fails (a loaded machine's answers take seconds)."""


@contextmanager
def opened(browser, url: str | None = None, width: int = 1280, height: int = 800,
           ready: str = "layers", wait_ms: int = WAIT_MS) -> Iterator:
    """A fresh page in its own context at width x height, every wait bounded by `wait_ms`, the
    console's errors and the page's uncaught exceptions gathered in `pg.errors`; at `url` (when
    given) once the page's model line says `ready` (the page has read /v1/inspect). On leaving
    without an exception: the context closed, and no error in the console but
    `pg.expected_errors` (what a test's own bad request makes the browser log)."""
    context = browser.new_context(viewport={"width": width, "height": height})
    pg = context.new_page()
    pg.errors, pg.expected_errors = [], []
    pg.on("console", lambda m: pg.errors.append(m.text) if m.type == "error" else None)
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    pg.set_default_timeout(wait_ms)
    try:
        if url is not None:
            pg.goto(url)
            pg.wait_for_function("document.querySelector('#model-line')?.textContent"
                                 f".includes({json.dumps(ready)})")
        yield pg
    finally:
        context.close()
    assert pg.errors == pg.expected_errors, f"the browser's console: {pg.errors}"
