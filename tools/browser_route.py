"""What every request of a rendered page goes through: the URL policy, the pinned fetch, the headers.

Split from :mod:`.browser` by concern: :class:`RequestGuard` is the route handler that
:class:`~mgrpo_tools.browser.BrowserFetcher` installs on every page (see that module's docstring for
why Chromium opens no connection of its own), with the per-fetch state it shares with the navigation
code (``_Job``, ``_Tab``), and the script every page runs to count its own requests (``_NET_SCRIPT``:
the page's end of the same count).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urljoin

import httpx

from .base import ToolError
from .bounded_body import BoundedBody
from .fetch import REDIRECT_STATUSES, _looks_binary, is_text_content_type

__all__ = ["RequestGuard", "page_content"]


# Installed in every document before its scripts run: counts the page's own fetch() calls, their
# body reads and XMLHttpRequests from the moment a script starts one, and ends each one task after
# it settles (so the page's handlers of the answer have run). The route handler sees a request only
# when Chromium hands it over, which on a loaded machine (a slow renderer, a stalled worker loop) can
# come after its quiet window has passed; the page's own count cannot lag. `__mgrpoNet(waitMs)`
# resolves once nothing is pending (or after waitMs) to [pending, the DOM as page.content() reads
# it, or null while pending], read in the same task, with serializers taken before any page script ran.
_NET_SCRIPT = """(() => {
  if (window.__mgrpoNet) return;
  const Serializer = XMLSerializer, serialize = XMLSerializer.prototype.serializeToString;
  const outer = Object.getOwnPropertyDescriptor(Element.prototype, 'outerHTML').get;
  let pending = 0, waiters = [];
  const start = () => { pending += 1; };
  const end = () => { setTimeout(() => {
    pending -= 1;
    if (pending === 0) { const ready = waiters; waiters = []; ready.forEach((wake) => wake()); }
  }, 0); };
  const counted = (call) => function (...args) {
    start();
    let promise;
    try { promise = call.apply(this, args); } catch (error) { end(); throw error; }
    Promise.resolve(promise).then(end, end);
    return promise;
  };
  if (window.fetch) window.fetch = counted(window.fetch);
  if (window.Response) {
    for (const name of ['arrayBuffer', 'blob', 'formData', 'json', 'text']) {
      const read = Response.prototype[name];
      if (read) Response.prototype[name] = counted(read);
    }
  }
  if (window.XMLHttpRequest) {
    const send = XMLHttpRequest.prototype.send;
    XMLHttpRequest.prototype.send = function (...args) {
      start();
      this.addEventListener('loadend', end, { once: true });
      try { return send.apply(this, args); } catch (error) { this.removeEventListener('loadend', end); end(); throw error; }
    };
  }
  const read = () => {
    if (pending > 0) return [pending, null];
    let html = document.doctype ? serialize.call(new Serializer(), document.doctype) : '';
    if (document.documentElement) html += outer.call(document.documentElement);
    return [0, html];
  };
  Object.defineProperty(window, '__mgrpoNet', { value: (waitMs) => new Promise((resolve) => {
    if (pending === 0) { resolve(read()); return; }
    const wake = () => resolve(read());
    waiters.push(wake);
    setTimeout(wake, waitMs);
  }) });
})();"""


@dataclass
class _Job:
    """State of one fetch, shared between the navigation code and the route handler."""

    url: str
    deadline: float
    navigating: bool = True  # main-frame requests are the fetch's own navigation until load
    redirect_to: str | None = None  # a main-frame redirect, followed by the navigation loop
    error: ToolError | None = None  # why the main-frame request was aborted
    blocked: list[str] = field(default_factory=list)
    inflight: int = 0  # requests inside the route handler (every network request passes there)
    started: int = 0  # requests that reached the route handler so far
    last_activity: float = field(default_factory=time.monotonic)
    has_scripts: bool = True  # whether the document has <script>; without, nothing changes after load

    def remaining_ms(self) -> float:
        return max(1.0, (self.deadline - time.monotonic()) * 1000.0)


@dataclass
class _Tab:
    """A browser context with its one page; ``job`` is the fetch it serves (None while prepared)."""

    context: Any
    page: Any = None
    job: _Job | None = None



class RequestGuard:
    """The route handler of a browser fetcher; it reads the fetcher's ``policy``, ``max_redirects``,
    ``max_bytes``, ``timeout_s`` and its pinned async client ``_http``."""

    async def _route(self, route: Any, tab: _Tab) -> None:
        """Count the request as in flight while :meth:`_guard` decides and serves it."""
        job = tab.job
        if job is None:  # a prepared tab loads nothing before it is handed to a fetch
            await route.abort("blockedbyclient")
            return
        job.inflight += 1
        job.started += 1
        try:
            await self._guard(route, job)
        finally:
            job.inflight -= 1
            job.last_activity = time.monotonic()

    async def _guard(self, route: Any, job: _Job) -> None:
        """Serve a request only if the policy accepts it and every redirect hop it takes.

        The request is made here, by the pinned HTTP client (:mod:`.pinning`), and handed to
        Chromium with ``route.fulfill``: Chromium never opens a connection itself, so a name is
        resolved once, by the policy, and the socket goes to the address it checked.
        """
        from playwright.async_api import Error as PlaywrightError

        request = route.request
        main = job.navigating and request.is_navigation_request() and request.frame.parent_frame is None
        origins = self.policy.origin_map
        url = origins.to_virtual(request.url)  # judged (and recorded when blocked) as the agent sees it
        try:
            method, body = request.method, request.post_data_buffer
            headers = _forward_headers(await request.all_headers())  # with cookies, unlike .headers
            for _hop in range(self.max_redirects + 1):
                real = origins.to_real(url)
                try:
                    self.policy.check(url, resolve=False)  # the address rules run at connect time
                    status, reply_headers, content = await self._fetch_pinned(
                        method, real, headers, body, job, main, shown=url
                    )
                except ToolError as exc:
                    if exc.kind == "policy" or exc.message.startswith("cannot resolve"):
                        job.blocked.append(url)
                    if main:
                        job.error = exc
                    await route.abort("blockedbyclient" if exc.kind == "policy" else "failed")
                    return
                location = reply_headers.get("location")
                if status not in REDIRECT_STATUSES or not location:
                    break
                if main:
                    # Navigate to the hop ourselves so that the page's URL is the final one.
                    job.redirect_to = origins.to_virtual(urljoin(real, location))
                    await route.abort("aborted")
                    return
                url = origins.to_virtual(urljoin(real, location))
                method, body = "GET", None
            else:
                await route.abort("failed")
                return
            if main:
                job.has_scripts = b"<script" in content.lower()
            await route.fulfill(status=status, headers=reply_headers, body=content)
        except PlaywrightError:
            with contextlib.suppress(PlaywrightError):  # the page or context is already gone
                await route.abort("failed")

    async def _fetch_pinned(
        self, method: str, url: str, headers: dict[str, str], body: bytes | None, job: _Job, main: bool,
        *, shown: str,
    ) -> tuple[int, dict[str, str], bytes]:
        """``(status, headers, body)`` of one request without following redirects; ToolError on failure.

        The body is streamed and cut at ``max_bytes`` (a 50 MB page or a gzip bomb is never held
        whole), and the whole exchange is bounded by the job's deadline (a server that drips bytes).
        ``url`` is where to connect; errors name ``shown`` (the URL as the agent sees it).
        """
        assert self._http is not None

        async def exchange() -> tuple[int, dict[str, str], bytes]:
            async with self._http.stream(method, url, headers=headers, content=body) as response:
                reply = _reply_headers(response.headers)
                if response.status_code in REDIRECT_STATUSES:
                    return response.status_code, reply, b""
                mime = response.headers.get("content-type", "")
                if main and mime and not is_text_content_type(mime):
                    raise ToolError("content", f"{shown} is not a text page (content-type {mime.split(';')[0]})")
                declared = response.headers.get("content-length", "")
                if declared.isdigit() and int(declared) > self.max_bytes:
                    raise ToolError("content", f"page larger than {self.max_bytes} bytes ({declared} declared) at {shown}")
                # Raw bytes, inflated within max_bytes (httpx would inflate a whole read at once).
                reader = BoundedBody(self.max_bytes, response.headers.get("content-encoding", ""), shown)
                async for raw in response.aiter_raw():
                    reader.feed(raw)
                content = reader.value()
                if main and _looks_binary(content, response.charset_encoding):
                    raise ToolError("content", f"{shown} looks binary (NUL bytes), not a text page")
                return response.status_code, reply, content

        try:
            return await asyncio.wait_for(exchange(), timeout=job.remaining_ms() / 1000.0)
        except (asyncio.TimeoutError, TimeoutError, httpx.TimeoutException):
            raise ToolError("timeout", f"{shown} did not answer within {self.timeout_s:g} s") from None
        except httpx.HTTPError as exc:  # refused, reset, bad gzip, protocol errors
            raise ToolError("http", f"cannot fetch {shown}: {type(exc).__name__}: {exc}") from None


# Headers Chromium sends that the HTTP client sets itself (or must not forward).
_DROP_REQUEST = frozenset({"host", "content-length", "connection", "keep-alive", "accept-encoding",
                           "transfer-encoding", "upgrade", "proxy-connection", "te", "trailer"})
# The client hands over a decoded body of known length: its framing headers no longer apply.
_DROP_REPLY = frozenset({"content-encoding", "content-length", "transfer-encoding", "connection", "keep-alive"})


def _forward_headers(headers: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in _DROP_REQUEST and not k.startswith(":")}


def _reply_headers(headers: httpx.Headers) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in headers.multi_items():
        key = key.lower()
        if key in _DROP_REPLY:
            continue
        # Playwright splits a fulfilled Set-Cookie on newlines; other repeated headers join with commas.
        joiner = "\n" if key == "set-cookie" else ", "
        out[key] = f"{out[key]}{joiner}{value}" if key in out else value
    return out


async def page_content(page: Any) -> str:
    """The page's DOM as HTML; read again after the load when the page navigated itself (a script or a
    meta refresh) while it was read."""
    from playwright.async_api import Error as PlaywrightError

    try:
        return await page.content()
    except PlaywrightError:
        await page.wait_for_load_state("load")
        return await page.content()
