"""Screenshots of the page of `sheepop serve` for docs/serve.md and the README.

    python docs/make_page_images.py RUN_DIR [--prompt TEXT] [--out docs/images]

Serves RUN_DIR (a trained run: `make run` makes one) with `--runs` over its parent folder, drives
the page in Debian's Chromium through Playwright (as tests/serve/test_page_browser.py does),
and writes page-generate.png, page-inside.png and page-runs.png at 1280x800, and
page-inside-phone.png at 390x844.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

from playwright.sync_api import sync_playwright

WAIT_MS = 60_000


def serve(run: Path) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "sheepop", "serve", str(run), "--port", "0",
                             "--runs", str(run.resolve().parent)],
                            stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        found = re.search(r" at (http://\S+)", line)
        if found:
            return proc, found.group(1)
    raise SystemExit("the server did not start")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--prompt", default="import os\n\n\ndef main(args):\n    ")
    ap.add_argument("--max-tokens", type=int, default=60)
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("images"))
    args = ap.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("no chromium: apt-get install chromium (make system-deps)")
    proc, url = serve(args.run_dir)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.set_default_timeout(WAIT_MS)
            page.goto(url + "/")
            page.wait_for_function("document.querySelector('#model-line').textContent"
                                   ".includes('layers')")
            page.get_by_test_id("prompt").fill(args.prompt)
            page.fill("#max-tokens", str(args.max_tokens))
            page.get_by_test_id("generate").click()
            page.wait_for_function("document.querySelector('#generate-status').textContent"
                                   ".includes('tokens in')")
            page.get_by_test_id("token").nth(len(args.prompt) // 2 + 6).hover()
            page.screenshot(path=str(args.out / "page-generate.png"))
            page.mouse.move(1, 1)
            page.get_by_test_id("view-inside").click()
            page.wait_for_selector("[data-testid=logit-lens] tbody tr")
            page.get_by_test_id("layer").select_option("1")
            page.screenshot(path=str(args.out / "page-inside.png"), full_page=True)
            page.get_by_test_id("view-runs").click()
            page.wait_for_function("Number(document.querySelector('[data-testid=loss-chart]')"
                                   ".dataset.points) > 0")
            page.screenshot(path=str(args.out / "page-runs.png"))
            page.set_viewport_size({"width": 390, "height": 844})
            page.get_by_test_id("view-inside").click()
            page.screenshot(path=str(args.out / "page-inside-phone.png"))
            browser.close()
    finally:
        proc.terminate()
        proc.wait(30)
    print(f"wrote the page's screenshots into {args.out}")


if __name__ == "__main__":
    main()
