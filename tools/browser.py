"""Render pages that need JavaScript with a headless Chromium (Playwright), under the URL policy.

Playwright objects belong to the thread (event loop) that created them, while tools are called from
many rollout threads. :class:`BrowserFetcher` therefore owns ONE worker thread running an asyncio
loop with Playwright's async API; :meth:`BrowserFetcher.fetch` submits a job to that loop and waits on
a ``concurrent.futures.Future`` with a timeout. Up to ``max_pages`` pages render concurrently inside
that single thread, each in a fresh browser context (no cookies or storage leak between agents);
one never-used context is kept ready (``prewarm``) because starting Chromium's renderer for a new
context is most of a fetch's cost.

The policy applies to the top-level URL and to every request the page makes: a route handler
(:mod:`.browser_route`, split out by concern) checks each request, aborts what the policy refuses,
and makes the rest itself with the pinned HTTP client
(:mod:`.pinning`: a name is resolved once, by the policy, and the socket goes to the address it
checked), handing the reply to Chromium with ``route.fulfill``. Chromium's own resolver is switched
off (``--host-resolver-rules``), so it cannot open a connection of its own. Bodies are streamed and
cut at ``max_bytes``. The handler fetches with redirects disabled and follows them itself, checking each hop;
for the top-level document the hop is handed back to :meth:`fetch`, which navigates to it (so the
page's URL is the real one). Service workers are blocked and WebSockets are never connected.

Virtual origins (:meth:`UrlPolicy.map_origin`): Chromium navigates to the virtual URL itself (so
``page.url``, ``location`` and relative links all show the stable origin); the route handler checks
the policy on that virtual URL and fetches the real origin it maps to in its place. A request or
redirect that names the real origin is turned back into the virtual one before it is checked.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import shutil
import threading
import time
from typing import Any

import httpx

from .base import ToolError
from .bounded_body import ACCEPT_ENCODING
from .browser_route import _NET_SCRIPT, RequestGuard, _Job, _Tab, page_content
from .cache import ResponseCache
from .chromium import INSTALL_HINT, default_chromium
from .fetch import FetchResult
from .pinning import AsyncPinnedTransport
from .render_cache import RenderCache
from .url_policy import UrlPolicy

logger = logging.getLogger(__name__)

__all__ = ["BrowserFetcher", "CHROMIUM_ARGS"]

CHROMIUM_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    # Chromium resolves no name itself: every request is served by the route handler through the
    # pinned client, so nothing (preconnect, DNS prefetch, an unrouted request) can reach an address
    # the policy did not check.
    "--host-resolver-rules=MAP * ~NOTFOUND",
)


class BrowserFetcher(RequestGuard):
    """Fetch pages with headless Chromium; same ``fetch(url) -> FetchResult`` as the HTTP fetcher.

    The browser starts on the first fetch. ``FetchResult.text`` is the rendered DOM
    (what ``page.content()`` reads) after the ``load`` event and a short network-quiet wait.

    Args:
        policy: URL policy for the page and each of its requests.
        executable_path: the Chromium binary (default: ``$MGRPO_CHROMIUM`` or Debian's ``/usr/bin/chromium``).
        timeout_s: limit for rendering one page, navigation and the settle included, from the moment
            its fresh page is ready (a free page slot and Chromium's new renderer are not counted:
            on a loaded machine they take seconds that say nothing about the page).
        max_bytes: largest document (and rendered DOM) accepted.
        cache: optional response cache (namespace ``"browser"``).
        max_pages: pages rendered at the same time.
        prewarm: fresh contexts (each with a blank page) kept ready, so that a fetch does not wait for
            Chromium to start a renderer process (~150 ms); a prepared context has never loaded
            anything, so every fetch still gets a clean one. 0 turns this off.
        max_redirects: redirect hops followed for the document and for each sub-resource.
        idle_s: after ``load``, wait until no request has been in flight for this long at the route
            handler and none is pending in the page (pages that fetch their content with JavaScript),
            bounded by ``max_idle_wait_s``.
        max_idle_wait_s: the longest wait for that quiet period.
        launch_args: Chromium command-line switches.
        startup_timeout_s: limit for launching the browser, and for opening a fresh page for a fetch.
        render_cache: optional in-memory cache of rendered pages (:mod:`.render_cache`), for sites
            whose pages are static: each page is rendered once, later fetches get the same DOM.
    """

    via = "browser"

    def __init__(
        self,
        policy: UrlPolicy,
        *,
        executable_path: str | None = None,
        timeout_s: float = 15.0,
        max_bytes: int = 2_000_000,
        cache: ResponseCache | None = None,
        max_pages: int = 4,
        prewarm: int = 1,
        max_redirects: int = 5,
        idle_s: float = 0.1,
        max_idle_wait_s: float = 2.0,
        launch_args: tuple[str, ...] = CHROMIUM_ARGS,
        startup_timeout_s: float = 60.0,
        render_cache: RenderCache | None = None,
    ) -> None:
        self.policy = policy
        self.executable_path = executable_path or default_chromium()
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self.cache = cache
        self.max_pages = max_pages
        self.prewarm = prewarm
        self.max_redirects = max_redirects
        self.idle_s = idle_s
        self.max_idle_wait_s = max_idle_wait_s
        self.launch_args = tuple(launch_args)
        self.startup_timeout_s = startup_timeout_s
        self.render_cache = render_cache
        self._lock = threading.Lock()
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._playwright: Any = None
        self._browser: Any = None
        self._launch_lock: asyncio.Lock | None = None
        self._pages: asyncio.Semaphore | None = None
        # Owned by the worker loop: prepared tabs, and the background tasks that make and close tabs.
        self._spares: list[_Tab] = []
        self._refills: set[asyncio.Task[None]] = set()
        self._closing: set[asyncio.Task[None]] = set()
        self._http: httpx.AsyncClient | None = None  # the pinned client of the route handlers (worker loop)

    # -- public API ----------------------------------------------------------------------------

    @property
    def started(self) -> bool:
        """True once the worker thread runs (the browser itself may be relaunched on demand)."""
        return self._thread is not None

    def start(self) -> None:
        """Launch Chromium now rather than on the first fetch; raise :class:`ToolError` if it cannot start."""
        self._ensure_started()

    def fetch(self, url: str) -> FetchResult:
        """Render ``url`` and return its DOM; raise :class:`ToolError` on any failure."""
        start = time.perf_counter()
        key = self.policy.check(url, resolve=False)
        if self.cache is not None:
            hit = self.cache.get("browser", key)
            if hit is not None:
                return FetchResult.from_cache_value(hit, time.perf_counter() - start)
        if self.render_cache is not None:
            if self._closed:  # a closed fetcher refuses hits too, as it would a render
                raise ToolError("backend", "the browser fetcher is closed")
            result = self.render_cache.get_or_render(key, lambda: self._render_now(key, start),
                                                     lambda: time.perf_counter() - start)
        else:
            result = self._render_now(key, start)[0]
        if self.cache is not None:
            self.cache.put("browser", key, result.to_cache())
        return result

    def _render_now(self, checked: str, start: float) -> tuple[FetchResult, bool]:
        """Render a policy-checked URL on the worker loop: ``(result, whether it may be reused)``."""
        # The address rules run when the route handler connects (pinned).
        loop = self._ensure_started()
        future = asyncio.run_coroutine_threadsafe(self._fetch_async(checked, start), loop)
        try:
            # The coroutine enforces timeout_s itself; the margin covers a slow (re)launch and a slow
            # new page (opening one is bounded by startup_timeout_s).
            return future.result(timeout=self.timeout_s + 2 * self.startup_timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise ToolError("timeout", f"the browser did not render {checked} in time") from None

    def pages_open(self) -> int:
        """Pages open for fetches now (rendering or being closed), the prepared spares not counted:
        0 when no fetch is under way, which is what a server checks for leaked pages."""
        loop = self._loop
        if loop is None:
            return 0

        async def count() -> int:
            contexts = self._browser.contexts if self._browser is not None and self._browser.is_connected() else []
            return max(0, len(contexts) - len(self._spares))

        try:
            return asyncio.run_coroutine_threadsafe(count(), loop).result(timeout=self.startup_timeout_s)
        except (RuntimeError, concurrent.futures.TimeoutError):  # the loop stopped meanwhile: nothing is open
            return 0

    def close(self) -> None:
        """Close the browser and stop the worker thread; later fetches are refused."""
        with self._lock:
            self._closed = True
            loop, thread = self._loop, self._thread
            self._loop, self._thread = None, None
        if loop is None or thread is None:
            return
        # Closing must not fail: the browser may be gone already, the process may be exiting.
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(timeout=20)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=20)
        if not thread.is_alive():
            loop.close()

    def __enter__(self) -> BrowserFetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- worker thread -------------------------------------------------------------------------

    def _ensure_started(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._closed:
                raise ToolError("backend", "the browser fetcher is closed")
            if self._loop is not None:
                return self._loop
            path = self.executable_path
            found = path if os.path.isabs(path) else shutil.which(path)
            if not found or not os.path.isfile(found) or not os.access(found, os.X_OK):
                raise ToolError("backend", f"Chromium not found at {path}; {INSTALL_HINT}")
            try:
                import playwright.async_api  # noqa: F401 - fail early with a clear message
            except ImportError:
                raise ToolError("backend", "the 'playwright' package is not installed") from None
            self.executable_path = found
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=self._run_loop, args=(loop,), name="mgrpo-browser", daemon=True)
            thread.start()
            try:
                asyncio.run_coroutine_threadsafe(self._launch(), loop).result(timeout=self.startup_timeout_s)
            except BaseException as exc:
                with contextlib.suppress(Exception):  # the driver may be up even if Chromium is not
                    asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(timeout=20)
                loop.call_soon_threadsafe(loop.stop)
                thread.join(timeout=20)
                if isinstance(exc, ToolError):
                    raise
                raise ToolError(
                    "backend", f"cannot start Chromium at {path}: {type(exc).__name__}: {exc}"
                ) from None
            self._loop, self._thread = loop, thread
            return loop

    @staticmethod
    def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        loop.run_forever()

    async def _launch(self) -> None:
        from playwright.async_api import async_playwright

        if self._launch_lock is None:
            self._launch_lock = asyncio.Lock()
            self._pages = asyncio.Semaphore(self.max_pages)
        async with self._launch_lock:
            if self._browser is not None and self._browser.is_connected():
                return
            if self._http is None:
                self._http = httpx.AsyncClient(
                    transport=AsyncPinnedTransport(
                        self.policy, limits=httpx.Limits(max_connections=64, max_keepalive_connections=16)
                    ),
                    timeout=httpx.Timeout(self.timeout_s),
                    follow_redirects=False,  # every hop passes the policy: _guard follows them
                    trust_env=False,  # an environment proxy would hide the real destination
                    headers={"Accept-Encoding": ACCEPT_ENCODING},  # what BoundedBody inflates within max_bytes
                )
            if self._playwright is None:
                self._playwright = await async_playwright().start()
            self._spares.clear()  # contexts of a dead browser are useless
            if self._browser is not None:  # it was running: it crashed or was killed
                logger.warning("mgrpo: Chromium is gone (crashed or killed); starting a new one for %s", self.executable_path)
            self._browser = await self._playwright.chromium.launch(
                executable_path=self.executable_path, args=list(self.launch_args), headless=True
            )
        self._schedule_refill()

    async def _new_tab(self) -> _Tab:
        """A fresh context with a blank page, the policy route and the request bookkeeping installed."""
        context = await self._browser.new_context(service_workers="block", accept_downloads=False)
        tab = _Tab(context)
        try:
            await context.add_init_script(_NET_SCRIPT)
            await context.route("**/*", lambda route: self._route(route, tab))
            if hasattr(context, "route_web_socket"):
                # A WebSocket route that never calls connect_to_server() is never connected.
                await context.route_web_socket("**/*", lambda ws: None)
            tab.page = await context.new_page()
        except BaseException:
            with contextlib.suppress(Exception):
                await context.close()
            raise
        return tab

    async def _take_tab(self) -> _Tab:
        """A never-used tab: a prepared one if ready, else a new one."""
        if not self._spares and self._refills:
            # One is being prepared: waiting for it is cheaper than starting a second renderer.
            await asyncio.wait(list(self._refills))
        return self._spares.pop() if self._spares else await self._new_tab()

    def _spawn(self, coro: Any, tasks: set[asyncio.Task[None]]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        tasks.add(task)  # keep a reference until done, or the task may be collected mid-flight
        task.add_done_callback(tasks.discard)

    def _schedule_refill(self) -> None:
        if len(self._spares) + len(self._refills) < self.prewarm:
            self._spawn(self._refill(), self._refills)

    async def _refill(self) -> None:
        browser = self._browser
        with contextlib.suppress(Exception):  # a spare is an optimisation; a failure here is harmless
            tab = await self._new_tab()
            if browser is self._browser and browser.is_connected():
                self._spares.append(tab)
            else:
                await tab.context.close()

    @staticmethod
    async def _close_tab(tab: _Tab) -> None:
        with contextlib.suppress(Exception):  # the browser may have died with the page
            await tab.context.close()

    async def _shutdown(self) -> None:
        for task in list(self._refills):
            task.cancel()
        for tab in self._spares:
            await self._close_tab(tab)
        self._spares.clear()
        if self._closing:
            await asyncio.wait(list(self._closing), timeout=5)
        for obj, method in ((self._browser, "close"), (self._playwright, "stop")):
            if obj is not None:
                with contextlib.suppress(Exception):  # best effort: the browser may already be gone
                    await getattr(obj, method)()
        self._browser, self._playwright = None, None
        if self._http is not None:
            with contextlib.suppress(Exception):
                await self._http.aclose()
            self._http = None

    # -- one fetch (runs on the worker loop) ---------------------------------------------------

    async def _fetch_async(self, url: str, start: float) -> tuple[FetchResult, bool]:
        from playwright.async_api import Error as PlaywrightError

        assert self._pages is not None
        try:
            async with self._pages:
                if self._browser is None or not self._browser.is_connected():
                    await self._launch()  # the browser crashed or was killed: start a new one
                tab = await self._open_tab(url)
                try:
                    # The clock starts when the page is ready: waiting for a slot or for Chromium to
                    # start a renderer (seconds on a loaded machine) is not the page's rendering.
                    job = _Job(url=url, deadline=time.monotonic() + self.timeout_s)
                    return await asyncio.wait_for(self._render(job, tab, start), timeout=self.timeout_s)
                finally:
                    # Closing takes ~20 ms the caller need not wait for; the context is never reused.
                    # The spare is prepared after the fetch, not during it: starting a renderer costs CPU.
                    self._spawn(self._close_tab(tab), self._closing)
                    self._schedule_refill()
        except (asyncio.TimeoutError, TimeoutError):
            raise ToolError("timeout", f"{url} did not render within {self.timeout_s:g} s") from None
        except PlaywrightError as exc:
            message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            if "Timeout" in type(exc).__name__ or "Timeout" in message:
                raise ToolError("timeout", f"{url} did not render within {self.timeout_s:g} s") from None
            raise ToolError("http", f"the browser could not load {url}: {message}") from None

    async def _open_tab(self, url: str) -> _Tab:
        """A fresh tab for the fetch of ``url``, bounded by ``startup_timeout_s`` (the browser's own
        setup, like its launch: a context and a renderer process, not the page)."""
        try:
            return await asyncio.wait_for(self._take_tab(), timeout=self.startup_timeout_s)
        except (asyncio.TimeoutError, TimeoutError):
            raise ToolError("timeout", f"the browser could not open a page for {url} within "
                                       f"{self.startup_timeout_s:g} s") from None

    async def _render(self, job: _Job, tab: _Tab, start: float) -> tuple[FetchResult, bool]:
        from playwright.async_api import Error as PlaywrightError

        tab.job = job
        page = tab.page
        current = job.url
        response = None
        for _hop in range(self.max_redirects + 1):
            job.redirect_to, job.error = None, None
            try:
                response = await page.goto(current, wait_until="load", timeout=job.remaining_ms())
            except PlaywrightError:
                if job.redirect_to is not None:
                    current = self.policy.check(job.redirect_to)
                    continue
                if job.error is not None:
                    raise job.error from None
                raise
            break
        else:
            raise ToolError(
                "http", f"too many redirects (more than {self.max_redirects}) starting at {job.url}"
            )
        job.navigating = False
        status = response.status if response is not None else 200
        if status >= 400:
            raise ToolError(
                "http", f"HTTP {status} {response.status_text} for {current}".strip(), status=status
            )
        content_type = ""
        if response is not None:
            content_type = response.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        settled, html = await self._settle(job, page)
        # A page still fetching when we read it, or one that forbids storing, is not reused.
        reusable = settled and "no-store" not in (
            response.headers.get("cache-control", "").lower() if response is not None else "")
        html = self.policy.origin_map.virtualize_text(html if html is not None else await page_content(page))
        if len(html.encode("utf-8", errors="replace")) > self.max_bytes:
            raise ToolError("content", f"page larger than {self.max_bytes} bytes at {current}")
        return FetchResult(
            url=page.url,
            status=status,
            content_type=content_type or "text/html",
            text=html,
            elapsed_s=time.perf_counter() - start,
            from_cache=False,
            via=self.via,
            blocked=tuple(job.blocked),
        ), reusable

    async def _settle(self, job: _Job, page: Any) -> tuple[bool, str | None]:
        """Wait until the page is quiet (bounded by ``max_idle_wait_s``), for JS-loaded content:
        ``(settled, its DOM read at that moment or None)``; False when the wait ran out first (the page
        was still loading when read).

        Quiet at both ends: no request at the route handler (which sees every network request) for
        ``idle_s``, and none pending in the page (:data:`.browser_route._NET_SCRIPT`: fetches and XHRs from the moment
        a script starts them until its handlers of the answer ran; the page is asked once the route is
        quiet, and waits in the page for its own requests). A document without scripts cannot change
        after ``load``, so it is not waited for.
        """
        if not job.has_scripts:
            return True, None
        # A script may start a request from its onload handler just after we got "load": wait
        # at least idle_s from now, not from the last request.
        job.last_activity = time.monotonic()
        limit = min(time.monotonic() + self.max_idle_wait_s, job.deadline - 0.5)
        while time.monotonic() < limit:
            if job.inflight == 0 and time.monotonic() - job.last_activity >= self.idle_s:
                started = job.started
                pending, html = await self._read_when_idle(page, limit - time.monotonic())
                # A request the route saw start meanwhile may change the page after this read.
                if pending == 0 and job.started == started and job.inflight == 0:
                    return True, html
                if pending < 0:  # the page could not answer (busy, or navigating)
                    await asyncio.sleep(0.02)
                continue
            await asyncio.sleep(0.02)
        return False, None

    @staticmethod
    async def _read_when_idle(page: Any, timeout_s: float) -> tuple[int, str | None]:
        """``(requests pending in the page, its DOM when none)``, waiting in the page up to ``timeout_s``
        for them; ``(0, None)`` without the counter (the route handler's count is then all there is),
        ``(-1, None)`` when the page did not answer in time."""
        from playwright.async_api import Error as PlaywrightError

        wait_ms = max(1, int(timeout_s * 1000))
        try:
            state = await asyncio.wait_for(
                page.evaluate("(ms) => window.__mgrpoNet ? window.__mgrpoNet(ms) : null", wait_ms),
                timeout=max(0.01, timeout_s) + 0.5)
        except (asyncio.TimeoutError, TimeoutError, PlaywrightError):
            return -1, None
        if state is None:
            return 0, None
        return int(state[0]), state[1]
