"""The documentation site, built (`mkdocs build --strict`, as `make docs`) and driven in headless Chromium
over loopback: the front page renders with the demo's figure, every page of the navigation loads
without a console error, equations are drawn, and the built-in search finds "delegate". Every request
that leaves 127.0.0.1 is refused and recorded: the site must work offline."""

from __future__ import annotations

import functools
import http.server
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]

pytestmark = [pytest.mark.browser, pytest.mark.docs]


def nav_pages(nav: list) -> list[str]:
    """The Markdown files of mkdocs.yml's nav, in order."""
    pages: list[str] = []
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages += nav_pages(value) if isinstance(value, list) else [value]
    return pages


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(out)], cwd=ROOT,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def server(site: Path) -> Iterator[str]:
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    class Server(http.server.ThreadingHTTPServer):
        def handle_error(self, request: object, client_address: object) -> None:
            pass  # a tab that navigates away mid-download breaks its pipe: not the site's error

    httpd = Server(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()
    thread.join(5)


@pytest.fixture(scope="module")
def browser() -> Iterator[tuple]:
    sync_api = pytest.importorskip("playwright.sync_api")
    assert os.access(CHROMIUM, os.X_OK), f"no Chromium at {CHROMIUM} (make chromium installs it)"
    with sync_api.sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = chromium.new_context()
        outside: list[str] = []

        def route(r) -> None:  # loopback only: anything else is refused and recorded
            if urlsplit(r.request.url).hostname == "127.0.0.1":
                r.continue_()
            else:
                outside.append(r.request.url)
                r.abort()

        context.route("**/*", route)
        yield context, outside
        context.close()
        chromium.close()


def open_page(context, url: str) -> tuple:
    """A new tab at ``url``; the console errors and uncaught exceptions it reports."""
    tab = context.new_page()
    errors: list[str] = []
    tab.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    tab.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
    response = tab.goto(url, wait_until="load")
    assert response is not None and response.status == 200, url
    return tab, errors


def loaded_images(tab) -> dict[str, int]:
    return tab.evaluate("Object.fromEntries([...document.images].map(i => [i.getAttribute('src'), i.naturalWidth]))")


def test_front_page_renders_with_the_demos_figure(server, browser):
    context, outside = browser
    tab, errors = open_page(context, server + "/index.html")
    assert tab.locator("article h1").first.inner_text().rstrip("¶") == "mgrpo"
    assert "make demo" in tab.locator("article").inner_text()
    images = loaded_images(tab)
    assert images.get("benchmarks/results/demo_seed0/headline.png", 0) > 0, images
    assert not errors and not outside, (errors, outside)
    tab.close()


@pytest.mark.timeout(900)  # ~30 s on 2 quiet cores; pages load 5-15 s each when the cores are saturated
def test_every_nav_page_loads_without_a_console_error(server, browser):
    context, outside = browser
    pages = nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    assert len(pages) >= 30
    tab, errors = open_page(context, server + "/index.html")
    problems = {}
    for page in pages:  # one tab for all: its listeners see every page's errors
        seen = len(errors)
        response = tab.goto(f"{server}/{page.removesuffix('.md')}.html", wait_until="load")
        broken = {src: w for src, w in loaded_images(tab).items() if not w}
        if response is None or response.status != 200 or errors[seen:] or broken or not tab.locator("article h1").count():
            problems[page] = (response and response.status, errors[seen:], broken)
    tab.close()
    assert not problems and not outside, (problems, outside)


def test_equations_are_drawn_and_the_viewer_screenshot_shows(server, browser):
    context, outside = browser
    tab, errors = open_page(context, server + "/concepts/method.html")
    formulas = tab.locator("article math")
    assert formulas.count() >= 8
    heights = tab.evaluate("[...document.querySelectorAll('article math[display=block]')].map(m => m.getBoundingClientRect().height)")
    assert heights and min(heights) > 10, heights  # drawn as MathML, a fraction taller than a line
    assert "\\frac" not in tab.locator("article").inner_text()  # no TeX source left on the page
    tab.close()
    tab, errors2 = open_page(context, server + "/getting-started.html")
    assert loaded_images(tab).get("assets/view.png", 0) > 0
    tab.close()
    assert not errors and not errors2 and not outside


def test_search_finds_delegate_offline(server, browser):
    context, outside = browser
    tab, errors = open_page(context, server + "/index.html")
    tab.locator("input.md-search__input").click()
    tab.locator("input.md-search__input").fill("delegate")
    results = tab.locator(".md-search-result__item")
    # the search index is built in a web worker on first use: 15 s was not always enough on 2 busy cores
    results.first.wait_for(timeout=60_000)
    assert results.count() >= 3
    hrefs = [results.nth(i).locator("a").first.get_attribute("href") for i in range(results.count())]
    assert any("concepts/" in h or "guides/" in h for h in hrefs), hrefs
    assert "delegate" in tab.locator(".md-search-result").inner_text().lower()
    assert not errors and not outside, (errors, outside)
    tab.close()
