"""Screenshots of the page of `sheepop serve` for docs/serve.md and the README.

    python docs/make_page_images.py RUN_DIR [--prompt TEXT] [--out docs/images]

Serves RUN_DIR (a trained run: `make run` makes one) with `--runs` over its parent folder, drives
the page in Debian's Chromium through Playwright (as tests/serve/test_page_browser.py does),
and writes page-generate.png, page-inside.png (and its panels: page-inside-heads.png,
page-inside-sampled.png, page-inside-lens.png) and page-runs.png at 1280x800, and
page-inside-phone.png at 390x844; then the Step view (page-step.png, page-step-attention.png,
page-step-sampling.png, page-step-phone.png) and the Backprop view (page-backward.png,
page-backward-phone.png) on the text generated, and the Patching view with its form's own
example (page-patch.png, page-patch-shares.png). `--views step,backward` takes only those (the
docs' ones are of SmolLM2: `sheepop import` its GGUF, then give that run).
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


def step_view(page, out: Path, at: str | None) -> None:
    """The Step view at the last token `at` (default: the middle generated token), a middle
    layer, the third head, temperature 0.8, top-k 5 and top-p 0.9: its top, the scores and
    softmax steps, and the sampling steps."""
    page.get_by_test_id("view-step").click()
    page.wait_for_selector("[data-testid=step-softmax]")
    page.fill("#step-temperature", "0.8")
    page.fill("#step-top-k", "5")
    page.fill("#step-top-p", "0.9")
    texts = page.eval_on_selector_all("[data-testid=step-token]",
                                      "bs => bs.map(b => b.dataset.text)")
    generated = page.eval_on_selector_all("[data-testid=step-token].generated", "b => b.length")
    found = [i for i, x in enumerate(texts) if x == at]
    position = found[-1] if found else len(texts) - max(1, generated) // 2 - 1
    page.get_by_test_id("step-token").nth(position).click()
    page.wait_for_function(f"document.querySelector('#step-status').textContent"
                           f".includes('position {position},')")
    layers = page.get_by_test_id("step-layer").locator("option").count()
    page.get_by_test_id("step-layer").select_option(str(layers // 2))
    page.wait_for_function(f"document.querySelector('#step-status').textContent"
                           f".includes('layer {layers // 2 + 1} of')")
    heads = page.get_by_test_id("step-head").locator("option").count()
    page.get_by_test_id("step-head").select_option(str(min(2, heads - 1)))
    page.screenshot(path=str(out / "page-step.png"))
    for number, name in ((5, "page-step-attention.png"), (15, "page-step-sampling.png")):
        page.evaluate(f"document.querySelector('#step .step-card[data-step=\"{number}\"]')"
                      ".scrollIntoView()")
        page.evaluate("document.querySelectorAll('.keys').forEach(k => "
                      "k.scrollTop = k.scrollHeight)")  # the masked keys: the last rows
        page.screenshot(path=str(out / name))
    page.evaluate("window.scrollTo(0, 0)")


def backward_view(page, out: Path, name: str, grads: str | None = None) -> None:
    """The Backprop view's top (the loss, dZ's row) and, at `grads`, its gradients' bars."""
    page.get_by_test_id("view-backward").click()
    page.wait_for_selector("[data-testid=backward-grads] tbody tr")
    page.screenshot(path=str(out / name))
    if grads:
        page.evaluate("document.querySelector('#backward .step-card[data-step=\"3\"]')"
                      ".scrollIntoView()")
        page.screenshot(path=str(out / grads))
        page.evaluate("window.scrollTo(0, 0)")


def inside_view(page, out: Path) -> None:
    """The inside view: page-inside.png (whole), and the panels of issue 30 at 1280x800:
    page-inside-heads.png (every head of layer 2, head 2 enlarged), page-inside-sampled.png
    (the sampled distribution at T 0.8, top-k 10), page-inside-lens.png (the lens's chart)."""
    page.get_by_test_id("view-inside").click()
    page.wait_for_selector("[data-testid=logit-lens] tbody tr")
    page.wait_for_selector("[data-testid=sampled] tbody tr")
    page.get_by_test_id("layer").select_option("1")
    page.wait_for_function("document.querySelector('[data-testid=attention]').dataset.layer "
                           "=== '1'")
    page.get_by_test_id("head-thumb").nth(1).click()
    page.screenshot(path=str(out / "page-inside.png"), full_page=True)
    shots = {"page-inside-heads.png": ("#heads", 120), "page-inside-sampled.png": ("#sampled", 220),
             "page-inside-lens.png": ("#lens-nats", 420)}
    page.fill("#s-temperature", "0.8")
    page.fill("#s-top-k", "10")
    page.dispatch_event("#s-top-k", "input")
    page.mouse.move(1, 1)
    for name, (selector, above) in shots.items():
        page.evaluate(f"window.scrollTo(0, document.querySelector('{selector}')"
                      f".getBoundingClientRect().top + window.scrollY - {above})")
        page.screenshot(path=str(out / name))


def patch_view(page, out: Path) -> None:
    """The Patching view on its form's example (France / Italy, " Paris" / " Rome"): the two
    grids with a cell under the pointer (page-patch.png), the direct attribution's bars
    (page-patch-shares.png)."""
    page.get_by_test_id("view-patch").click()
    page.get_by_test_id("patch-run").click()
    page.wait_for_selector("[data-testid=patch-estimated] td", timeout=10 * WAIT_MS)
    cells = page.locator("[data-testid=patch-exact] td")
    page.evaluate("document.querySelector('#patch-metric').scrollIntoView()")
    cells.nth(cells.count() // 2 + 3).hover()
    page.screenshot(path=str(out / "page-patch.png"))
    page.evaluate("document.querySelector('#shares-panel').scrollIntoView()")
    page.mouse.move(1, 1)
    page.screenshot(path=str(out / "page-patch-shares.png"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--prompt", default="import os\n\n\ndef main(args):\n    ")
    ap.add_argument("--max-tokens", type=int, default=60)
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("images"))
    ap.add_argument("--temperature", type=float,
                    help="the generation's temperature (default: the page's); 0: greedy")
    ap.add_argument("--step-at", help="the Step view's token (its text; default: the middle "
                    "generated token)")
    ap.add_argument("--views", default="generate,inside,runs,step,backward,patch",
                    help="the views to take (after generating), comma-separated")
    args = ap.parse_args()
    views = set(args.views.split(","))
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
            if args.temperature is not None:
                page.fill("#temperature", str(args.temperature))
            page.get_by_test_id("generate").click()
            page.wait_for_function("document.querySelector('#generate-status').textContent"
                                   ".includes('tokens in')")
            if "generate" in views:
                page.get_by_test_id("token").nth(len(args.prompt) // 2 + 6).hover()
                page.screenshot(path=str(args.out / "page-generate.png"))
                page.mouse.move(1, 1)
            if "inside" in views:
                inside_view(page, args.out)
            if "runs" in views:
                page.get_by_test_id("view-runs").click()
                page.wait_for_function("Number(document.querySelector('[data-testid=loss-"
                                       "chart]').dataset.points) > 0")
                page.screenshot(path=str(args.out / "page-runs.png"))
            if "step" in views:
                step_view(page, args.out, args.step_at)
            if "backward" in views:
                backward_view(page, args.out, "page-backward.png", "page-backward-grads.png")
            if "patch" in views:
                patch_view(page, args.out)
            page.set_viewport_size({"width": 390, "height": 844})
            if "inside" in views:
                page.get_by_test_id("view-inside").click()
                page.screenshot(path=str(args.out / "page-inside-phone.png"))
            if "step" in views:
                page.get_by_test_id("view-step").click()
                page.locator("#step-status").scroll_into_view_if_needed()
                page.screenshot(path=str(args.out / "page-step-phone.png"))
            if "backward" in views:
                backward_view(page, args.out, "page-backward-phone.png")
            browser.close()
    finally:
        proc.terminate()
        proc.wait(30)
    print(f"wrote the page's screenshots into {args.out}")


if __name__ == "__main__":
    main()
