"""Fetch a web page over plain HTTP, safely: the URL policy on every hop, size and type limits.

:class:`HttpFetcher` is the fast path of the ``visit`` tool (no JavaScript). It follows redirects
itself so that each hop passes :meth:`UrlPolicy.check`, streams the body and stops at
``max_bytes``, refuses binary content, decodes text with the declared charset, and records
successful pages in a :class:`ResponseCache` (namespace ``"fetch"``, keyed by the normalised URL).

Virtual origins (:meth:`UrlPolicy.map_origin`): the policy judges the URL as written, the request
goes to the real origin it maps to, and the result shows the virtual origin again: ``url``, redirect
targets (a ``Location`` on the real origin becomes the virtual one before it is checked) and
absolute URLs of the real origin in the body. Cache keys and values therefore hold only the virtual
origin, so a cache recorded against one run's loopback port replays in any other run.

Every connection goes through :class:`~.pinning.PinnedTransport`: a host name is resolved once,
by the policy, and the socket opens to an address that passed its rules (no DNS-rebinding window).
The URL itself is checked with the static rules first (``resolve=False``); the address rules run at
connect time, on the very answer that is connected to.

Failures are :class:`ToolError` with a kind the agent can act on: ``policy``, ``http`` (4xx/5xx,
connection refused, too many redirects), ``timeout``, ``content`` (too large, binary), ``cache``
(a miss in replay mode).
"""

from __future__ import annotations

import codecs
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any, Protocol
from urllib.parse import urljoin

import httpx

from .base import ToolError
from .bounded_body import ACCEPT_ENCODING, BoundedBody
from .cache import ResponseCache
from .pinning import PinnedTransport
from .url_policy import UrlPolicy

__all__ = ["FetchResult", "HttpFetcher", "is_text_content_type", "REDIRECT_STATUSES"]

REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
_TEXT_TYPES = frozenset(
    {"application/xhtml+xml", "application/xml", "application/json", "application/ld+json"}
)
_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9._:-]+)""", re.IGNORECASE)
_SNIFF_BYTES = 8192


@dataclass(frozen=True)
class FetchResult:
    """A fetched page.

    Attributes:
        url: the final URL, after redirects.
        status: HTTP status of the final response.
        content_type: the media type without parameters (``"text/html"``), or ``""`` when absent.
        text: the decoded body (for the browser: the rendered DOM serialised as HTML).
        elapsed_s: wall time of this fetch (for a cache hit: the lookup time).
        from_cache: served from the response cache.
        via: ``"http"`` or ``"browser"``.
        blocked: URLs of requests the policy refused while rendering (browser only).
    """

    url: str
    status: int
    content_type: str
    text: str
    elapsed_s: float
    from_cache: bool
    via: str
    blocked: tuple[str, ...] = ()

    def to_cache(self) -> dict[str, Any]:
        """The JSON object stored in the cache (timing and cache flag are per call, not stored)."""
        data = asdict(self)
        data.pop("elapsed_s")
        data.pop("from_cache")
        data["blocked"] = list(self.blocked)
        return data

    @classmethod
    def from_cache_value(cls, value: dict[str, Any], elapsed_s: float) -> FetchResult:
        """Rebuild a result from :meth:`to_cache` output."""
        return cls(
            url=str(value["url"]),
            status=int(value["status"]),
            content_type=str(value.get("content_type", "")),
            text=str(value["text"]),
            elapsed_s=elapsed_s,
            from_cache=True,
            via=str(value.get("via", "http")),
            blocked=tuple(value.get("blocked", ())),
        )


def is_text_content_type(mime: str) -> bool:
    """True for media types a text reader can use: ``text/*``, XHTML, XML and JSON flavours."""
    mime = mime.split(";", 1)[0].strip().lower()
    return mime.startswith("text/") or mime in _TEXT_TYPES or mime.endswith("+xml") or mime.endswith("+json")


def _decode(body: bytes, charset: str | None, mime: str) -> str:
    """Decode with the declared charset, else a ``<meta charset>`` for HTML, else UTF-8; never fails."""
    if body.startswith(codecs.BOM_UTF8):
        return body[len(codecs.BOM_UTF8) :].decode("utf-8", errors="replace")
    candidates = [charset]
    if mime in ("text/html", "application/xhtml+xml", ""):
        match = _META_CHARSET.search(body[:4096])
        if match:
            candidates.append(match.group(1).decode("ascii", errors="ignore"))
    for name in candidates:
        if not name:
            continue
        try:
            codecs.lookup(name)
        except LookupError:
            continue
        return body.decode(name, errors="replace")
    return body.decode("utf-8", errors="replace")


def _looks_binary(body: bytes, charset: str | None) -> bool:
    """NUL bytes near the start mean binary, unless the charset is a UTF-16/32 (which has them)."""
    if charset and charset.lower().replace("-", "").startswith(("utf16", "utf32")):
        return False
    return b"\x00" in body[:_SNIFF_BYTES]


class PageStore(Protocol):
    """What :class:`HttpFetcher` needs of a ``static_cache`` (:class:`~.render_cache.RenderCache` is one)."""

    def get_or_render(self, key: str, render: Callable[[], tuple[FetchResult, bool]],
                      elapsed: Callable[[], float]) -> FetchResult: ...


class HttpFetcher:
    """Thread-safe HTTP(S) page fetcher with policy checks on every redirect hop.

    One shared ``httpx.Client`` (connection pool) serves all threads.

    Args:
        policy: the URL policy applied to the URL and each redirect target.
        timeout_s: limit for connecting, for each read, and for the whole fetch.
        max_bytes: largest body accepted (after content decoding); larger pages are refused.
        max_redirects: redirect hops followed before giving up.
        user_agent: the ``User-Agent`` header sent.
        cache: optional response cache (namespace ``"fetch"``).
        static_cache: optional in-memory :class:`~.render_cache.RenderCache` for a site whose pages never
            change while it runs (a built world): each page is fetched over HTTP once, later fetches
            get the same result (the policy still runs first; failures are not kept). Saves the HTTP
            round trip through Python that dominates an env step when the same pages are read by every
            rollout of a group.
    """

    via = "http"

    def __init__(
        self,
        policy: UrlPolicy,
        *,
        timeout_s: float = 10.0,
        max_bytes: int = 2_000_000,
        max_redirects: int = 5,
        user_agent: str = "mgrpo/0.1 (+research agent)",
        cache: ResponseCache | None = None,
        static_cache: PageStore | None = None,
    ) -> None:
        self.policy = policy
        self.static_cache = static_cache
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self.max_redirects = max_redirects
        self.user_agent = user_agent
        self.cache = cache
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=16)
        self._client = httpx.Client(
            transport=PinnedTransport(policy, limits=limits),  # connects only to checked addresses
            timeout=httpx.Timeout(timeout_s),
            follow_redirects=False,  # every hop must pass the policy: we follow them ourselves
            trust_env=False,  # an environment proxy would hide the real destination from the policy
            headers={
                "User-Agent": user_agent,
                "Accept": "text/html,application/xhtml+xml,text/plain;q=0.9,*/*;q=0.5",
                "Accept-Encoding": ACCEPT_ENCODING,  # what BoundedBody inflates within max_bytes
            },
        )

    def fetch(self, url: str) -> FetchResult:
        """Fetch ``url`` (following redirects); raise :class:`ToolError` on any failure."""
        start = time.perf_counter()
        key = self.policy.check(url, resolve=False)  # the static rules hold for cached pages too
        if self.cache is not None:
            hit = self.cache.get("fetch", key)
            if hit is not None:
                return FetchResult.from_cache_value(hit, time.perf_counter() - start)
        # The address rules run when the socket opens (PinnedTransport), on the answer connected to.
        if self.static_cache is not None:
            result = self.static_cache.get_or_render(key, lambda: (self._fetch_live(key, start), True),
                                                     lambda: time.perf_counter() - start)
        else:
            result = self._fetch_live(key, start)
        if self.cache is not None:
            self.cache.put("fetch", key, result.to_cache())
        return result

    def _fetch_live(self, url: str, start: float) -> FetchResult:
        deadline = start + self.timeout_s
        current = url
        try:
            origins = self.policy.origin_map
            for _hop in range(self.max_redirects + 1):
                real = origins.to_real(current)
                with self._client.stream("GET", real) as response:
                    status = response.status_code
                    if status in REDIRECT_STATUSES:
                        location = response.headers.get("location")
                        if not location:
                            raise ToolError(
                                "http", f"HTTP {status} redirect without a Location for {current}"
                            )
                        current = self.policy.check(origins.to_virtual(urljoin(real, location)), resolve=False)
                        continue
                    if status >= 300:
                        reason = f"{status} {response.reason_phrase}".strip()
                        raise ToolError("http", f"HTTP {reason} for {current}", status=status)
                    result = self._read(response, current, deadline, start)
                    if real != current:  # a page of a mapped site may name its real origin
                        text = origins.virtualize_text(result.text)
                        if text != result.text:
                            result = replace(result, text=text)
                    return result
            raise ToolError("http", f"too many redirects (more than {self.max_redirects}) starting at {url}")
        except httpx.TimeoutException:
            raise ToolError("timeout", f"{url} did not answer within {self.timeout_s:g} s") from None
        except httpx.InvalidURL as exc:
            raise ToolError("policy", f"malformed URL {current!r}: {exc}") from None
        except httpx.HTTPError as exc:  # connection refused, reset, bad gzip, protocol errors
            raise ToolError("http", f"cannot fetch {current}: {type(exc).__name__}: {exc}") from None

    def _read(self, response: httpx.Response, url: str, deadline: float, start: float) -> FetchResult:
        mime = response.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if mime and not is_text_content_type(mime):
            raise ToolError("content", f"{url} is not a text page (content-type {mime})", content_type=mime)
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            raise ToolError(
                "content", f"page larger than {self.max_bytes} bytes ({declared} declared) at {url}"
            )
        # Raw bytes, inflated here within max_bytes (httpx would inflate a whole read at once).
        reader = BoundedBody(self.max_bytes, response.headers.get("content-encoding", ""), url)
        for raw in response.iter_raw():
            reader.feed(raw)
            # httpx times each read; a server that trickles bytes is stopped by the overall deadline.
            if time.perf_counter() > deadline:
                raise ToolError("timeout", f"{url} did not finish within {self.timeout_s:g} s")
        body = reader.value()
        charset = response.charset_encoding
        if _looks_binary(body, charset):
            raise ToolError("content", f"{url} looks binary (NUL bytes), not a text page")
        return FetchResult(
            url=url,
            status=response.status_code,
            content_type=mime,
            text=_decode(body, charset, mime),
            elapsed_s=time.perf_counter() - start,
            from_cache=False,
            via=self.via,
        )

    def close(self) -> None:
        """Close the connection pool."""
        self._client.close()

    def __enter__(self) -> HttpFetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
