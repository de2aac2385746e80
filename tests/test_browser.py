"""BrowserFetcher (headless Chromium via Playwright) and the visit tool's browser modes."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import quote

import pytest
from web_fixtures import (  # noqa: F401 - fixtures
    JS_FETCH_TEXT,
    JS_LATE_TEXT,
    JS_TEXT,
    RouteServer,
    other_server_fixture,
    route_server_fixture,
)

from mgrpo_tools import BrowserFetcher, HttpFetcher, ToolError, UrlPolicy, VisitTool, make_browsing_tools

CHROMIUM = "/usr/bin/chromium"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK), reason=f"Chromium not installed at {CHROMIUM}"),
]


@pytest.fixture(scope="module")
def browser_policy(route_server: RouteServer) -> UrlPolicy:
    policy = UrlPolicy()
    policy.allow_origin(route_server.origin)
    return policy


@pytest.fixture(scope="module")
def browser(browser_policy: UrlPolicy) -> Iterator[BrowserFetcher]:
    """One browser for the module (launching Chromium takes about a second)."""
    fetcher = BrowserFetcher(browser_policy, executable_path=CHROMIUM, timeout_s=10, max_bytes=100_000)
    yield fetcher
    fetcher.close()


@pytest.fixture(scope="module")
def http(browser_policy: UrlPolicy) -> Iterator[HttpFetcher]:
    fetcher = HttpFetcher(browser_policy, timeout_s=5)
    yield fetcher
    fetcher.close()


def test_browser_renders_javascript(browser: BrowserFetcher, route_server: RouteServer) -> None:
    result = browser.fetch(route_server.url("/js"))
    assert result.via == "browser" and result.status == 200 and not result.from_cache
    assert result.url == route_server.url("/js")
    assert JS_TEXT in result.text  # in the rendered DOM, not in the served HTML's text
    late = browser.fetch(route_server.url("/js-fetch"))
    assert JS_FETCH_TEXT in late.text  # content that arrives by fetch() after load


def test_a_page_that_fetches_its_text_late_after_load_is_read_with_it(browser_policy: UrlPolicy,
                                                                     route_server: RouteServer) -> None:
    """The settle race, made deterministic: the page's script starts its fetch 0.3 s after `load` (busy
    the whole time, as a renderer on a loaded machine) and the server answers it 0.3 s later. Quiet
    for 0.1 s at the route handler is no proof: the page is read only once it has no fetch pending
    and its handlers ran, and only such a read is offered to a render cache."""
    from mgrpo_tools import RenderCache

    cache = RenderCache()
    # A generous bound on the wait (the default is 2 s): this is about what is read, not how fast.
    with BrowserFetcher(browser_policy, executable_path=CHROMIUM, timeout_s=15, max_idle_wait_s=6,
                        render_cache=cache) as fetcher:
        before = len(route_server.hits("/late.json"))
        late = fetcher.fetch(route_server.url("/js-late"))
        assert JS_LATE_TEXT in late.text
        assert len(route_server.hits("/late.json")) == before + 1
        assert (cache.stats.misses, cache.stats.uncacheable, len(cache)) == (1, 0, 1)  # settled: kept
        assert fetcher.fetch(route_server.url("/js-late")).text == late.text


def test_the_dom_read_when_the_page_settles_is_what_page_content_reads(browser_policy: UrlPolicy,
                                                                       route_server: RouteServer,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The settle reads the DOM in the page, in the task that found it quiet; the text is the one
    Playwright's ``page.content()`` gives for the same page."""
    paths = ["/js", "/js-fetch", "/js-late", "/storage"]
    with BrowserFetcher(browser_policy, executable_path=CHROMIUM, timeout_s=10) as fetcher:
        read = {path: fetcher.fetch(route_server.url(path)).text for path in paths}
        settle_read = BrowserFetcher._read_when_idle

        async def without_dom(page, timeout_s):
            pending, _ = await settle_read(page, timeout_s)
            return pending, None  # the caller then reads page.content()

        monkeypatch.setattr(BrowserFetcher, "_read_when_idle", staticmethod(without_dom))
        content = {path: fetcher.fetch(route_server.url(path)).text for path in paths}
    assert read == content
    assert JS_TEXT in read["/js"] and JS_FETCH_TEXT in read["/js-fetch"] and JS_LATE_TEXT in read["/js-late"]


def test_browser_blocks_subresources_to_disallowed_origins(
    browser: BrowserFetcher, route_server: RouteServer, other_server: RouteServer
) -> None:
    secret = other_server.url("/secret")
    page = route_server.url("/subresource?to=" + quote(secret, safe=""))
    result = browser.fetch(page)
    assert "This page embeds a resource" in result.text
    assert secret in result.blocked
    assert other_server.hits("/secret") == []  # neither the <img> nor fetch() reached the server
    # A sub-resource redirected to the disallowed origin is stopped at the hop.
    hop = route_server.url("/redirect?to=" + quote(secret, safe=""))
    result = browser.fetch(route_server.url("/subresource?to=" + quote(hop, safe="")))
    assert secret in result.blocked
    assert other_server.hits("/secret") == []


def test_browser_top_level_policy_and_redirects(
    browser: BrowserFetcher, route_server: RouteServer, other_server: RouteServer
) -> None:
    with pytest.raises(ToolError) as info:
        browser.fetch(other_server.url("/secret"))
    assert info.value.kind == "policy"
    redirected = browser.fetch(route_server.url("/redirect?to=%2Fpage2"))
    assert redirected.url == route_server.url("/page2") and "river Lenta" in redirected.text
    with pytest.raises(ToolError) as info:
        browser.fetch(route_server.url("/redirect?to=" + quote(other_server.url("/secret"), safe="")))
    assert info.value.kind == "policy" and "loopback" in info.value.message
    assert other_server.hits("/secret") == []


@pytest.mark.parametrize(
    ("path", "kind", "words"),
    [
        ("/nope", "http", "HTTP 404"),
        ("/image.png", "content", "image/png"),
        ("/huge", "content", "page larger than 100000 bytes"),
        ("/loop", "http", "too many redirects"),
    ],
)
def test_browser_failures(
    browser: BrowserFetcher, route_server: RouteServer, path: str, kind: str, words: str
) -> None:
    with pytest.raises(ToolError) as info:
        browser.fetch(route_server.url(path))
    assert info.value.kind == kind and words in info.value.message, info.value


def test_browser_timeout(browser_policy: UrlPolicy, route_server: RouteServer) -> None:
    with BrowserFetcher(browser_policy, timeout_s=1.0) as quick:
        start = time.perf_counter()
        with pytest.raises(ToolError) as info:
            quick.fetch(route_server.url("/slow?s=3"))
        assert info.value.kind == "timeout"
        assert time.perf_counter() - start < 8  # includes launching Chromium


def test_browser_mode_auto_uses_browser_only_for_script_pages(
    http: HttpFetcher, browser: BrowserFetcher, route_server: RouteServer
) -> None:
    tools = make_browsing_tools(http, browser, browser_mode="auto", page_chars=1000)
    static = tools["visit"]({"url": route_server.url("/"), "goal": "capital"})
    assert static.ok and static.meta["via"] == "http" and "Ostrava Nova" in static.text
    scripted = tools["visit"]({"url": route_server.url("/js"), "goal": "archive"})
    assert scripted.ok and scripted.meta["via"] == "browser"
    assert JS_TEXT in scripted.text


def test_browser_mode_always_and_never(
    http: HttpFetcher, browser: BrowserFetcher, route_server: RouteServer
) -> None:
    always = VisitTool(http, browser, browser_mode="always")
    result = always({"url": route_server.url("/page2"), "goal": "g"})
    assert result.ok and result.meta["via"] == "browser" and "river Lenta" in result.text
    never = VisitTool(http, browser, browser_mode="never")
    result = never({"url": route_server.url("/js"), "goal": "g"})
    assert result.ok and result.meta["via"] == "http" and JS_TEXT not in result.text


def test_browser_from_several_threads(browser: BrowserFetcher, route_server: RouteServer) -> None:
    paths = ["/js", "/page2", "/", "/js-fetch", "/about", "/js"] * 2
    threads: set[str] = set()

    def job(path: str) -> str:
        threads.add(threading.current_thread().name)
        return browser.fetch(route_server.url(path)).text

    with ThreadPoolExecutor(6) as pool:
        texts = list(pool.map(job, paths))
    assert len(threads) > 1
    expected = {
        "/js": JS_TEXT,
        "/page2": "river Lenta",
        "/": "Ostrava Nova",
        "/js-fetch": JS_FETCH_TEXT,
        "/about": "invented country",
    }
    for path, text in zip(paths, texts, strict=True):
        assert expected[path] in text, path


def test_the_render_budget_starts_when_the_page_is_ready(browser_policy: UrlPolicy, route_server: RouteServer,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """On a loaded machine Chromium takes seconds to start a fresh context's renderer (measured: 3-5 s of
    a 6-8 s fetch under load on one core, with four pages opening at once), which used to be charged to
    the page's timeout_s: test_browser_from_several_threads timed out under load. Made deterministic:
    opening a page takes longer than timeout_s; the page still renders within its own budget, and
    opening a page is bounded by startup_timeout_s instead."""
    new_tab = BrowserFetcher._new_tab

    async def slow_new_tab(self: BrowserFetcher):
        await asyncio.sleep(5.5)  # a renderer starting on a loaded machine: longer than timeout_s
        return await new_tab(self)

    with BrowserFetcher(browser_policy, executable_path=CHROMIUM, timeout_s=5, prewarm=0) as fetcher:
        fetcher.start()
        monkeypatch.setattr(BrowserFetcher, "_new_tab", slow_new_tab)
        assert "river Lenta" in fetcher.fetch(route_server.url("/page2")).text
        fetcher.startup_timeout_s = 1.0
        start = time.perf_counter()
        with pytest.raises(ToolError) as info:
            fetcher.fetch(route_server.url("/page2"))
        assert info.value.kind == "timeout" and "could not open a page" in info.value.message
        assert time.perf_counter() - start < 3.0


def test_browser_contexts_do_not_share_state(browser: BrowserFetcher, route_server: RouteServer) -> None:
    # The page sets a cookie and localStorage and shows what it found before: a fresh context per
    # fetch means the second fetch finds nothing either.
    for _ in range(2):
        text = browser.fetch(route_server.url("/storage")).text
        assert "cookie=none stored=none" in text


def test_missing_chromium_is_a_clear_backend_error(
    browser_policy: UrlPolicy, route_server: RouteServer
) -> None:
    fetcher = BrowserFetcher(browser_policy, executable_path="/opt/none/chromium")
    with pytest.raises(ToolError) as info:
        fetcher.fetch(route_server.url("/"))
    assert info.value.kind == "backend" and info.value.message.startswith("Chromium not found at /opt/none/chromium; install it with `apt-get install -y chromium`")
    assert not fetcher.started


def test_closed_fetcher_refuses(browser_policy: UrlPolicy, route_server: RouteServer) -> None:
    fetcher = BrowserFetcher(browser_policy)
    assert fetcher.fetch(route_server.url("/about")).via == "browser"
    assert fetcher.started
    fetcher.close()
    assert not fetcher.started
    with pytest.raises(ToolError, match="closed"):
        fetcher.fetch(route_server.url("/about"))
    fetcher.close()  # idempotent


def test_browser_loads_a_virtual_origin_through_the_mapping(route_server: RouteServer, other_server: RouteServer) -> None:
    policy = UrlPolicy()
    policy.map_origin("http://routes.test", route_server.origin)
    with BrowserFetcher(policy, executable_path=CHROMIUM, timeout_s=10) as mapped:
        before = len(route_server.hits("/data.json"))
        late = mapped.fetch("http://routes.test/js-fetch")  # the page's fetch('/data.json') is mapped too
        assert late.url == "http://routes.test/js-fetch" and JS_FETCH_TEXT in late.text
        assert len(route_server.hits("/data.json")) == before + 1
        # Redirects show the virtual origin, whether the Location is relative or names the real origin.
        for target in ("/page2", route_server.url("/page2")):
            moved = mapped.fetch("http://routes.test/redirect?to=" + quote(target, safe=""))
            assert moved.url == "http://routes.test/page2" and "river Lenta" in moved.text
        # Sub-requests the policy refuses are still refused: another origin, the virtual host on another port.
        for secret in (other_server.url("/secret"), "http://routes.test:8080/secret"):
            result = mapped.fetch("http://routes.test/subresource?to=" + quote(secret, safe=""))
            assert secret in result.blocked and "This page embeds a resource" in result.text
        assert other_server.hits("/secret") == [] and route_server.hits("/secret") == []
        with pytest.raises(ToolError) as info:  # the real origin itself is not allowed
            mapped.fetch(route_server.url("/page2"))
        assert info.value.kind == "policy"


def test_a_killed_chromium_is_started_again_and_said_in_one_line(browser_policy: UrlPolicy, route_server: RouteServer,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """Chromium SIGKILLed between two fetches (an OOM killer, an operator): the next fetch starts a new
    one, says so in one logged line, and renders as before."""
    import signal

    import psutil

    fetcher = BrowserFetcher(browser_policy, executable_path=CHROMIUM, timeout_s=10, max_bytes=100_000)
    try:
        assert JS_TEXT in fetcher.fetch(route_server.url("/js")).text
        chromium = [p for p in psutil.Process().children(recursive=True) if "chrom" in p.name()]
        assert chromium, "no Chromium process under this one"
        for proc in chromium:
            proc.send_signal(signal.SIGKILL)
        psutil.wait_procs(chromium, timeout=10)
        result = fetcher.fetch(route_server.url("/js"))
        assert result.via == "browser" and JS_TEXT in result.text
        lines = [r.getMessage() for r in caplog.records if r.name == "mgrpo_tools.browser"]
        assert lines == [f"mgrpo: Chromium is gone (crashed or killed); starting a new one for {CHROMIUM}"]
    finally:
        fetcher.close()
