"""Debian's Chromium through Playwright (no browser download), for the page's browser tests:
where it is, the mark that skips a test without it, and the launch every test uses. The
`browser` and `shots` fixtures that use them are in tests/serve/conftest.py."""

from __future__ import annotations

import shutil

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no chromium: `make system-deps` "
                                    "installs it (apt-get install chromium)")


def launch(playwright):
    """Headless Chromium from a running `sync_playwright()`."""
    return playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
