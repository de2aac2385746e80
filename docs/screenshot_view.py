"""The trajectory viewer's picture in the docs (docs/assets/view.png), taken from a real run.

    python docs/screenshot_view.py [--questions 6] [--out docs/assets/view.png]

Evaluates the demo's start models (configs/demo-warm-start) on a few held-out questions of the demo's
world with `mgrpo eval` (real episodes through the env and the tools), renders them with `mgrpo view`,
opens the page in headless Chromium (/usr/bin/chromium, through Playwright), unfolds the first episode
and its first sub-agent, and saves a screenshot. Nothing is drawn by hand.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def run_and_view(folder: Path, questions: int) -> Path:
    """A real evaluation of the demo's start into ``folder`` and its view.html."""
    from mgrpo_algo.cli import main

    code = main(["eval", "--config", str(ROOT / "configs/demo.yaml"), "--agent", str(ROOT / "configs/demo-warm-start"),
                 "--set", f"eval.limit={questions}", "--set", "eval.samples=1", "--set", "eval.temperature=0",
                 "--quiet", "--out", str(folder)])
    if code != 0:
        raise SystemExit(f"mgrpo eval exited {code}")
    if main(["view", str(folder)]) != 0:
        raise SystemExit("mgrpo view failed")
    return folder / "view.html"


def screenshot(page_path: Path, out: Path) -> None:
    """Open the viewer, unfold the first episode and its first sub-agent, save a PNG of the window."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            tab = browser.new_page(viewport={"width": 1200, "height": 900})
            tab.goto(page_path.resolve().as_uri())
            first = tab.locator("details.ep").first
            first.locator("summary").first.click()
            sub = first.locator("details.sub").first
            if sub.count():
                sub.locator("summary").first.click()
            out.parent.mkdir(parents=True, exist_ok=True)
            tab.screenshot(path=str(out))
        finally:
            browser.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=6)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "assets" / "view.png")
    args = parser.parse_args(argv)
    out = args.out.resolve()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)  # the viewer's title shows the run folder as given: runs/demo-start-eval
        screenshot(run_and_view(Path("runs/demo-start-eval"), args.questions), out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
