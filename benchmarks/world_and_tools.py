"""World build time and tool speed, each next to the bare library call it wraps.

    .venv/bin/python benchmarks/world_and_tools.py [--entities 2000] [--quick]

Figures: wiki-hops build seconds at the given size; search queries/s of the SearchTool against a
bare tantivy ``searcher.search``; visit ms/page with httpx against a bare ``httpx.get`` plus the
HTML-to-text step; visit ms/page through Chromium against a bare Playwright ``page.goto``; cache-hit
ms; and the scenario oracle's accuracy on stage2/test (every answer reachable through search + visit).
Writes benchmarks/results/world_and_tools.json.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from common import median_ms, rate, report  # noqa: E402

from mgrpo_scenarios.wiki_hops import WikiHops  # noqa: E402
from mgrpo_tools.browser import CHROMIUM_ARGS  # noqa: E402
from mgrpo_tools.html_text import html_to_document, render_page  # noqa: E402
from mgrpo_tools.visit import make_browsing_tools  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--entities", type=int, default=2000)
    parser.add_argument("--quick", action="store_true", help="fewer repeats, 300 entities")
    args = parser.parse_args()
    n = 300 if args.quick else args.entities
    repeats = 5 if args.quick else 30
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        scenario = WikiHops(seed=0, num_entities=n, data_dir=tmp, cache_path=Path(tmp) / "cache.sqlite")
        t0 = time.perf_counter()
        scenario.build()
        rows.append((f"world build ({n} entities)", time.perf_counter() - t0, "s"))
        manifest = scenario.manifest()
        tasks = list(scenario.tasks("stage2/test"))
        graph = scenario.graph()
        names = [e.name for e in graph.entities][:200]
        with scenario.open() as world:
            # search: the tool against bare tantivy on the same index
            index = world.index._index  # the same tantivy index object, tokenizers registered
            queries = iter(names * 1000)

            def bare_search() -> None:
                searcher = index.searcher()
                q = index.parse_query(next(queries).lower(), ["title", "body"])
                for _, addr in searcher.search(q, 5).hits:
                    searcher.doc(addr)

            tool_queries = iter(names * 1000)
            rows.append(("search: bare tantivy", rate(bare_search), "queries/s"))
            backend = world.search.backend
            rows.append(("search: TantivyIndex.search (+snippets)", rate(lambda: backend.search(next(tool_queries), sites=None, k=5)), "queries/s"))
            rows[-1] = (rows[-1][0], rows[-1][1], f"queries/s ({rows[-1][1] / rows[-2][1]:.2f}x bare)")
            # visit, static pages: httpx + html_to_document vs the visit tool without cache
            static = [e for e in graph.entities if not e.js][:50]
            urls = iter([f"{world.served_url}/wiki/{e.slug}" for e in static] * 100)  # bare: the real port
            client = httpx.Client()

            def bare_visit() -> None:
                url = next(urls)
                r = client.get(url)
                render_page(html_to_document(r.text, url))

            visit_urls = iter([f"{world.url}/wiki/{e.slug}" for e in static] * 100)
            nocache = make_browsing_tools(world.http, world.browser, "never", 4000)["visit"]
            world.http.cache = None  # measure live fetches
            bare_ms = median_ms(bare_visit, repeats)
            tool_ms = median_ms(lambda: nocache({"url": next(visit_urls), "goal": "facts"}), repeats)
            rows.append(("visit static: bare httpx + html_to_document", bare_ms, "ms/page"))
            rows.append(("visit static: visit tool", tool_ms, f"ms/page ({bare_ms / tool_ms:.2f}x bare speed)"))
            # visit, JS pages through Chromium vs bare Playwright
            js = [e for e in graph.entities if e.js][:20]
            browser_tool = make_browsing_tools(world.http, world.browser, "always", 4000)["visit"]
            world.browser.cache = None
            js_urls = iter([f"{world.url}/wiki/{e.slug}" for e in js] * 100)
            b_ms = median_ms(lambda: browser_tool({"url": next(js_urls), "goal": "facts"}), max(3, repeats // 3))
            from playwright.sync_api import sync_playwright

            with sync_playwright() as pw:
                # the bare baseline resolves names itself: drop the tool's no-DNS rule (its requests go
                # through a route handler; a bare page has none)
                bare_args = [a for a in CHROMIUM_ARGS if not a.startswith("--host-resolver-rules")]
                browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=bare_args)
                page_urls = iter([f"{world.served_url}/wiki/{e.slug}" for e in js] * 100)

                def bare_browser() -> None:
                    ctx = browser.new_context()
                    page = ctx.new_page()
                    page.goto(next(page_urls), wait_until="load")
                    html_to_document(page.content(), page.url)
                    ctx.close()

                bare_b_ms = median_ms(bare_browser, max(3, repeats // 3))
                browser.close()
            rows.append(("visit JS page: bare Playwright goto + content", bare_b_ms, "ms/page"))
            rows.append(("visit JS page: visit tool (browser)", b_ms, f"ms/page ({bare_b_ms / b_ms:.2f}x bare speed)"))
        # cache hits: a fresh world with the cache on, second visit of the same page
        with scenario.open() as world:
            url = f"{world.url}/wiki/{static[0].slug}"
            world.make_tools()["visit"]({"url": url, "goal": "warm"})
            # a fresh browsing session each time, so the SQLite cache (not the session's page) serves it
            hit_ms = median_ms(lambda: world.make_tools()["visit"]({"url": url, "goal": "again"}), repeats)
            rows.append(("visit: SQLite cache hit (fresh session)", hit_ms, "ms/page"))
            search = world.tools["search"]
            search({"queries": [names[0]]})
            rows.append(("search: cache hit", median_ms(lambda: search({"queries": [names[0]]}), repeats), "ms/call"))
            # the oracle's reachability check on every stage2/test task
            t0 = time.perf_counter()
            runs = [scenario.oracle(task, world.make_tools()) for task in tasks]
            solved = sum(scenario.verify(t, r.answer).correct for t, r in zip(tasks, runs, strict=True))
            rows.append(("oracle stage2/test solved", f"{solved}/{len(tasks)}", "through search + visit"))
            rows.append(("oracle seconds per task", (time.perf_counter() - t0) / len(tasks), "s (cache warm after first use)"))
    report("world_and_tools", rows, {"manifest": manifest})


if __name__ == "__main__":
    main()
