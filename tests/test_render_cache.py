"""RenderCache: each page of a static site rendered once, exactly as a fresh render, and bounded."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from web_fixtures import JS_FETCH_TEXT, JS_TEXT, RouteServer, route_server_fixture  # noqa: F401 - fixtures

from mgrpo_tools import BrowserFetcher, FetchResult, HttpFetcher, RenderCache, ToolError, UrlPolicy, VisitTool

CHROMIUM = "/usr/bin/chromium"
chromium = pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK), reason=f"Chromium not installed at {CHROMIUM}")


def _page(url: str, text: str) -> FetchResult:
    return FetchResult(url=url, status=200, content_type="text/html", text=text, elapsed_s=0.3,
                       from_cache=False, via="browser")


def _zero() -> float:
    return 0.0


# ------------------------------------------------------------------------- the cache alone (no browser)


def test_a_page_is_rendered_once_and_hits_are_the_same_result() -> None:
    cache, calls = RenderCache(), []

    def render() -> tuple[FetchResult, bool]:
        calls.append(1)
        return _page("http://a.test/x", "<p>x</p>"), True

    first = cache.get_or_render("http://a.test/x", render, _zero)
    second = cache.get_or_render("http://a.test/x", render, _zero)
    assert len(calls) == 1 and not first.from_cache and second.from_cache
    assert (second.url, second.status, second.text, second.via) == (first.url, first.status, first.text, first.via)
    assert second.elapsed_s == 0.0  # a hit reports the caller's time, not the render's
    assert cache.stats.as_dict() == {"hits": 1, "misses": 1, "joined": 0, "uncacheable": 0, "evictions": 0,
                                     "loaded": 0, "unreadable": 0, "write_errors": 0}


def test_uncacheable_renders_and_failures_are_not_kept() -> None:
    cache, calls = RenderCache(), []

    def live() -> tuple[FetchResult, bool]:
        calls.append(1)
        return _page("http://a.test/live", f"<p>{len(calls)}</p>"), False

    texts = [cache.get_or_render("http://a.test/live", live, _zero).text for _ in range(3)]
    assert texts == ["<p>1</p>", "<p>2</p>", "<p>3</p>"] and len(cache) == 0
    assert cache.stats.uncacheable == 3

    def broken() -> tuple[FetchResult, bool]:
        calls.append(1)
        raise ToolError("timeout", "too slow")

    for _ in range(2):
        with pytest.raises(ToolError, match="too slow"):
            cache.get_or_render("http://a.test/broken", broken, _zero)
    assert len(cache) == 0 and len(calls) == 5  # tried again at each visit


def test_bounded_by_entries_and_bytes_least_recently_used_first() -> None:
    cache = RenderCache(max_entries=2, max_bytes=10)
    for name in ("a", "b"):
        cache.get_or_render(name, lambda n=name: (_page(n, n * 3), True), _zero)
    cache.get_or_render("a", lambda: (_page("a", "new"), True), _zero)  # a hit: "a" is now the most recent
    cache.get_or_render("c", lambda: (_page("c", "ccc"), True), _zero)
    assert len(cache) == 2 and cache.stats.evictions == 1
    assert cache.get_or_render("a", lambda: (_page("a", "fresh"), True), _zero).text == "aaa"  # kept
    assert cache.get_or_render("b", lambda: (_page("b", "again"), True), _zero).text == "again"  # evicted
    assert cache.nbytes <= 10
    cache.get_or_render("big", lambda: (_page("big", "x" * 11), True), _zero)  # larger than the budget
    assert cache.get_or_render("big", lambda: (_page("big", "y"), True), _zero).text == "y"
    assert len(cache) <= 2 and cache.nbytes <= 10
    with pytest.raises(ValueError):
        RenderCache(max_entries=0)


def test_renders_kept_in_a_file_serve_a_later_cache_without_rendering(tmp_path) -> None:
    path = tmp_path / "world" / "rendered" / "chromium-x.jsonl"
    first, calls = RenderCache(path=path), []

    def render(url: str, cacheable: bool = True):
        def go() -> tuple[FetchResult, bool]:
            calls.append(url)
            return FetchResult(url=url + "?final", status=203, content_type="text/html", text=f"<p>{url} \u00e9</p>",
                               elapsed_s=0.4, from_cache=False, via="browser", blocked=("http://x.test/a.js",)), cacheable
        return go

    made = first.get_or_render("http://a.test/1", render("http://a.test/1"), _zero)
    first.get_or_render("http://a.test/2", render("http://a.test/2"), _zero)
    first.get_or_render("http://a.test/live", render("http://a.test/live", cacheable=False), _zero)
    assert len(path.read_text(encoding="utf-8").splitlines()) == 2  # the live page is not kept
    with path.open("a", encoding="utf-8") as f:
        f.write('{"key": "http://a.test/3", "result": {"url": "trunc')  # a crash mid-write
    second = RenderCache(path=path)
    assert (second.stats.loaded, second.stats.unreadable, len(second)) == (2, 1, 2)
    again = second.get_or_render("http://a.test/1", render("http://a.test/1"), _zero)
    assert calls == ["http://a.test/1", "http://a.test/2", "http://a.test/live"]  # no render in the second cache
    assert again.from_cache and (again.url, again.status, again.content_type, again.text, again.via, again.blocked) == (
        made.url, made.status, made.content_type, made.text, made.via, made.blocked)
    second.get_or_render("http://a.test/3", render("http://a.test/3"), _zero)  # the unreadable page renders again
    assert calls[-1] == "http://a.test/3" and RenderCache(path=path).stats.loaded == 3


def test_a_file_that_cannot_be_written_leaves_the_memory_cache_working(tmp_path) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    cache, calls = RenderCache(path=blocker / "r.jsonl"), []

    def render() -> tuple[FetchResult, bool]:
        calls.append(1)
        return _page("http://a.test/x", "<p>x</p>"), True

    cache.get_or_render("http://a.test/x", render, _zero)
    assert cache.get_or_render("http://a.test/x", render, _zero).from_cache
    assert len(calls) == 1 and cache.stats.write_errors == 1


def test_concurrent_visits_of_one_page_share_one_render() -> None:
    cache, calls, gate = RenderCache(), [], threading.Event()

    def slow() -> tuple[FetchResult, bool]:
        calls.append(1)
        gate.wait(5)
        return _page("p", "<p>once</p>"), True

    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(cache.get_or_render, "p", slow, _zero) for _ in range(6)]
        time.sleep(0.2)
        gate.set()
        texts = [f.result(timeout=10).text for f in futures]
    assert texts == ["<p>once</p>"] * 6 and len(calls) == 1
    assert cache.stats.misses == 1 and cache.stats.joined + cache.stats.hits == 5

    def failing() -> tuple[FetchResult, bool]:
        gate2.wait(5)
        raise ToolError("http", "HTTP 500")

    gate2 = threading.Event()
    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(cache.get_or_render, "q", failing, _zero) for _ in range(3)]
        time.sleep(0.2)
        gate2.set()
        for f in futures:  # every waiter sees the owner's failure; nothing is kept
            with pytest.raises(ToolError, match="HTTP 500"):
                f.result(timeout=10)
    assert "q" not in cache._entries


def wait_until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Return once ``condition()`` holds (checked every millisecond); fail after ``timeout_s``. A wait
    for a state, not a guess of how long a thread takes to reach it."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.001)


def held_visits(cache: RenderCache, key: str, cacheable: bool) -> tuple[FetchResult, FetchResult, list[str]]:
    """Two visits of ``key``: the first held inside its render (an Event) until the second has joined
    it. Each visit renders its own text ("render by visit N"); returns both results and who rendered."""
    entered, release, rendered = threading.Event(), threading.Event(), []

    def render(visit: int) -> Callable[[], tuple[FetchResult, bool]]:
        def go() -> tuple[FetchResult, bool]:
            rendered.append(f"visit {visit}")
            if visit == 1:
                entered.set()
                assert release.wait(10)
            return _page(key, f"<p>render by visit {visit}</p>"), cacheable
        return go

    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(cache.get_or_render, key, render(1), _zero)
        assert entered.wait(10)  # visit 1 is inside its render
        second = pool.submit(cache.get_or_render, key, render(2), _zero)
        wait_until(lambda: cache.stats.joined == 1)  # visit 2 waits on visit 1's render
        assert rendered == ["visit 1"]
        release.set()
        return first.result(timeout=10), second.result(timeout=10), rendered


def test_a_visit_that_joins_the_render_of_an_uncacheable_page_renders_it_afresh() -> None:
    cache = RenderCache()
    first, second, rendered = held_visits(cache, "http://a.test/live", cacheable=False)
    # The live page's first render may not be reused, not even by a visit that waited for it: the
    # second visit renders the page itself, after the first, and is not reported as a cached page.
    assert rendered == ["visit 1", "visit 2"]
    assert (first.text, first.from_cache) == ("<p>render by visit 1</p>", False)
    assert (second.text, second.from_cache) == ("<p>render by visit 2</p>", False)
    assert cache.stats.as_dict() == {"hits": 0, "misses": 1, "joined": 1, "uncacheable": 1, "evictions": 0,
                                     "loaded": 0, "unreadable": 0, "write_errors": 0}
    assert len(cache) == 0


def test_a_visit_that_joins_the_render_of_a_cacheable_page_gets_that_render_as_cached() -> None:
    cache = RenderCache()
    first, second, rendered = held_visits(cache, "http://a.test/static", cacheable=True)
    assert rendered == ["visit 1"]  # one render serves both visits
    assert (first.text, first.from_cache) == ("<p>render by visit 1</p>", False)
    assert (second.text, second.from_cache, second.elapsed_s) == ("<p>render by visit 1</p>", True, 0.0)
    assert cache.stats.as_dict() == {"hits": 0, "misses": 1, "joined": 1, "uncacheable": 0, "evictions": 0,
                                     "loaded": 0, "unreadable": 0, "write_errors": 0}
    assert "http://a.test/static" in cache


# ------------------------------------------------------------------------- through Chromium


@pytest.fixture(scope="module")
def policy(route_server: RouteServer) -> UrlPolicy:
    policy = UrlPolicy()
    policy.allow_origin(route_server.origin)
    return policy


@pytest.fixture(scope="module")
def fetchers(policy: UrlPolicy) -> Iterator[tuple[BrowserFetcher, BrowserFetcher, HttpFetcher]]:
    """A browser with a render cache, one without, and the HTTP fetcher of the visit tool."""
    cached = BrowserFetcher(policy, executable_path=CHROMIUM, timeout_s=10, max_idle_wait_s=0.5,
                            render_cache=RenderCache(max_entries=16))
    fresh = BrowserFetcher(policy, executable_path=CHROMIUM, timeout_s=10, max_idle_wait_s=0.5)
    http = HttpFetcher(policy, timeout_s=5)
    yield cached, fresh, http
    for f in (cached, fresh, http):
        f.close()


@pytest.mark.browser
@chromium
@pytest.mark.parametrize("path", ["/js", "/js-fetch"])
def test_cached_render_is_exactly_a_fresh_render(path: str, fetchers, route_server: RouteServer) -> None:
    cached, fresh, http = fetchers
    url = route_server.url(path)
    before = len(route_server.hits(path))
    first, second = cached.fetch(url), cached.fetch(url)
    assert not first.from_cache and second.from_cache
    assert len(route_server.hits(path)) == before + 1  # the second visit did not reach the site
    reference = fresh.fetch(url)
    assert second.text == first.text == reference.text
    assert (second.url, second.status, second.content_type, second.blocked) == (
        reference.url, reference.status, reference.content_type, reference.blocked)
    assert (JS_TEXT if path == "/js" else JS_FETCH_TEXT) in second.text
    # What the agent reads (the visit tool's observation) is the same text too.
    tool_cached = VisitTool(http, cached, browser_mode="auto")({"url": url, "goal": "archive"})
    tool_fresh = VisitTool(http, fresh, browser_mode="auto")({"url": url, "goal": "archive"})
    assert tool_cached.ok and tool_cached.meta["via"] == "browser" and tool_cached.meta["from_cache"]
    assert tool_cached.text == tool_fresh.text


@pytest.mark.browser
@chromium
@pytest.mark.parametrize("path", ["/js-no-store", "/js-busy"])
def test_no_store_and_unsettled_pages_are_rendered_every_time(path: str, fetchers, route_server: RouteServer) -> None:
    cached, _, _ = fetchers
    url = route_server.url(path)
    before = len(route_server.hits(path))
    results = [cached.fetch(url) for _ in range(2)]
    assert len(route_server.hits(path)) == before + 2
    assert not any(r.from_cache for r in results)
    assert url not in cached.render_cache._entries


@pytest.mark.browser
@chromium
def test_the_policy_runs_before_the_cache(route_server: RouteServer) -> None:
    own = UrlPolicy()
    own.allow_origin(route_server.origin)
    with BrowserFetcher(own, executable_path=CHROMIUM, timeout_s=10, render_cache=RenderCache()) as browser:
        url = route_server.url("/js")
        assert JS_TEXT in browser.fetch(url).text and browser.fetch(url).from_cache
        own.disallow_origin(route_server.origin)
        with pytest.raises(ToolError) as info:
            browser.fetch(url)  # rendered before, refused now
        assert info.value.kind == "policy"
        own.allow_origin(route_server.origin)
        assert browser.fetch(url).from_cache
    with pytest.raises(ToolError, match="closed"):
        browser.fetch(url)  # a closed fetcher refuses even a kept page


def test_a_static_cache_fetches_each_page_over_http_once(route_server: RouteServer) -> None:
    policy = UrlPolicy(allow_private=True)
    with HttpFetcher(policy, static_cache=RenderCache()) as fetcher, HttpFetcher(policy) as plain:
        before = len(route_server.hits("/page2"))
        first, second = fetcher.fetch(route_server.url("/page2")), fetcher.fetch(route_server.url("/page2"))
        reference = plain.fetch(route_server.url("/page2"))
        assert len(route_server.hits("/page2")) - before == 2  # one fetch over HTTP each, the hit none
        assert not first.from_cache and second.from_cache and second.text == first.text == reference.text
        assert fetcher.static_cache.stats.misses == 1 and fetcher.static_cache.stats.hits == 1
        with pytest.raises(ToolError):  # a failure is not kept: tried again at the next fetch
            fetcher.fetch(route_server.url("/missing"))
        with pytest.raises(ToolError):
            fetcher.fetch(route_server.url("/missing"))
        assert fetcher.static_cache.stats.misses == 3 and len(fetcher.static_cache) == 1


class HeldSite:
    """A loopback site of two script pages, ``/live`` (``Cache-Control: no-store``) and ``/static``:
    each request is numbered per page and the page's script writes "render N"; the first request of
    each page is held (``arrived`` set, then it waits for ``release``), so a visit stays inside its
    render for as long as a test needs."""

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.counts: dict[str, int] = {}
        self.arrived = {path: threading.Event() for path in ("/live", "/static")}
        self.release = threading.Event()
        site, lock = self, threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
                pass

            def do_GET(self) -> None:
                if self.path not in site.arrived:
                    self.send_error(404)
                    return
                with lock:
                    n = site.counts[self.path] = site.counts.get(self.path, 0) + 1
                if n == 1:
                    site.arrived[self.path].set()
                    site.release.wait(10)
                body = (f"<!doctype html><html><body><div id=\"app\"></div><script>document.getElementById('app')"
                        f".textContent = 'render {n}';</script></body></html>").encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                if self.path == "/live":
                    self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(body)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        self.origin = f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        self.release.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


@pytest.mark.browser
@chromium
@pytest.mark.parametrize("path", ["/live", "/static"])
def test_a_second_visit_during_a_render_through_chromium(path: str) -> None:
    """A visit arrives while another renders the same page: of a no-store page it renders the page
    itself (the site sees two requests, it reads its own render, not from cache); of a static page it
    gets the first render, reported as cached (one request)."""
    site = HeldSite()
    policy = UrlPolicy()
    policy.allow_origin(site.origin)
    cache = RenderCache()
    try:
        with BrowserFetcher(policy, executable_path=CHROMIUM, timeout_s=20, render_cache=cache) as browser, \
                ThreadPoolExecutor(2) as pool:
            browser.start()
            url = site.origin + path
            first = pool.submit(browser.fetch, url)
            assert site.arrived[path].wait(20)  # the first visit's page request is held at the site
            second = pool.submit(browser.fetch, url)
            wait_until(lambda: cache.stats.joined == 1)
            site.release.set()
            a, b = first.result(timeout=30), second.result(timeout=30)
    finally:
        site.stop()
    assert "render 1" in a.text and not a.from_cache
    if path == "/live":
        assert site.counts == {"/live": 2}
        assert "render 2" in b.text and not b.from_cache
        assert (cache.stats.misses, cache.stats.joined, cache.stats.uncacheable, len(cache)) == (1, 1, 1, 0)
    else:
        assert site.counts == {"/static": 1}
        assert b.text == a.text and b.from_cache
        assert (cache.stats.misses, cache.stats.joined, cache.stats.uncacheable, len(cache)) == (1, 1, 0, 1)
