"""A render cache for :class:`~.browser.BrowserFetcher`: each page of a static site rendered once.

Rendering a JavaScript page in Chromium costs a few hundred milliseconds (a fresh context, the page's
scripts, a network-quiet wait), while a plain HTTP fetch of a loopback page costs about one. A
static world (the wiki-hops site: files on disk that never change during a run, scripts without
``Math.random`` or clocks) renders every page to the same DOM every time, so the first render can be
served to every later visit. The site owner opts in: only a world that knows its pages are static
should hand a :class:`RenderCache` to its browser.

What is cached, and what is not:

- keyed by the URL after :meth:`UrlPolicy.check` (the policy still runs on every fetch, hit or
  miss, so a URL the policy refuses is refused even if it was rendered before);
- only renders that settled (no request in flight for ``idle_s`` before ``max_idle_wait_s``: a page
  that keeps fetching is live, and its DOM depends on when it is read) and whose document did not
  say ``Cache-Control: no-store``;
- failures are never cached (a timeout or an HTTP error is tried again at the next visit);
- bounded by entries and by bytes of stored text, least recently used evicted first.

Concurrent visits of the same page while it renders wait for that one render (single flight)
instead of starting their own: B x K rollouts of one question open the same pages at the same time.

Kept on disk (``path``): every render the cache keeps is also appended to a JSON-lines file, and a
cache made with the same path starts with what the file holds. A world that lives in a folder that
never changes once built (wiki-hops: one folder per version, seed and options) keeps its renders
there, so each JavaScript page is rendered once per world *and browser* (the world names the file
after the Chromium executable), not once per open: every mode of a comparison, every evaluation and
every later run reads the same DOM without launching Chromium. A line that cannot be read (a crash
mid-write, two processes appending one large page at once) is skipped and counted
(``stats.unreadable``): that page is simply rendered again.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from .fetch import FetchResult

__all__ = ["RenderCache", "RenderCacheStats"]


@dataclass
class RenderCacheStats:
    """Counters since the cache was made."""

    hits: int = 0
    misses: int = 0  # renders started by this cache (one per page, when the page can be cached)
    joined: int = 0  # fetches that waited for a render already in flight
    uncacheable: int = 0  # renders that finished but may not be reused (unsettled, no-store)
    evictions: int = 0
    loaded: int = 0  # renders read from the file at start
    unreadable: int = 0  # lines of the file that could not be read (skipped)
    write_errors: int = 0  # renders that could not be appended to the file (kept in memory)

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


class RenderCache:
    """Thread-safe LRU of rendered pages (:class:`FetchResult`), bounded by entries and text bytes.

    Args:
        max_entries: pages kept at most (a wiki-hops full world has ~200 JavaScript pages).
        max_bytes: total UTF-8 bytes of kept DOM text at most; a page larger than this is not kept.
        path: a JSON-lines file that keeps the renders across caches and processes (see the module
            docstring), or None to keep them in memory only. Only for a site whose pages never change
            while the file exists.
    """

    def __init__(self, max_entries: int = 4096, max_bytes: int = 256 * 2**20,
                 path: str | os.PathLike | None = None) -> None:
        if max_entries < 1 or max_bytes < 1:
            raise ValueError("max_entries and max_bytes must be >= 1")
        self.max_entries = int(max_entries)
        self.max_bytes = int(max_bytes)
        self.stats = RenderCacheStats()
        self._entries: OrderedDict[str, tuple[FetchResult, int]] = OrderedDict()
        self._inflight: dict[str, concurrent.futures.Future[tuple[FetchResult, bool]]] = {}
        self._nbytes = 0
        self._lock = threading.Lock()
        self.path = Path(path) if path is not None else None
        if self.path is not None and self.path.is_file():
            self._load(self.path)

    def _load(self, path: Path) -> None:
        with path.open(encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    entry = json.loads(line)
                    key, result = str(entry["key"]), FetchResult.from_cache_value(entry["result"], 0.0)
                except (ValueError, KeyError, TypeError):
                    self.stats.unreadable += 1
                    continue
                self._keep(key, replace(result, from_cache=False), persist=False)
                self.stats.loaded += 1

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def __contains__(self, key: object) -> bool:
        """Whether a render of ``key`` (a policy-checked URL) is kept."""
        with self._lock:
            return key in self._entries

    @property
    def nbytes(self) -> int:
        """Bytes of DOM text kept now."""
        with self._lock:
            return self._nbytes

    def clear(self) -> None:
        """Forget every kept page (renders in flight still finish and are kept)."""
        with self._lock:
            self._entries.clear()
            self._nbytes = 0

    def get_or_render(self, key: str, render: Callable[[], tuple[FetchResult, bool]],
                      elapsed: Callable[[], float]) -> FetchResult:
        """The kept render of ``key``, or ``render()``'s result (kept when its flag says it may be).

        ``render`` returns ``(result, cacheable)`` or raises; a raise reaches every fetch that waited
        for it and nothing is kept. ``elapsed()`` is the caller's wall time so far, reported as a
        hit's ``elapsed_s``.
        """
        with self._lock:
            kept = self._entries.get(key)
            if kept is not None:
                self._entries.move_to_end(key)
                self.stats.hits += 1
                return replace(kept[0], from_cache=True, elapsed_s=elapsed())
            future = self._inflight.get(key)
            owner = future is None
            if owner:
                future = concurrent.futures.Future()
                self._inflight[key] = future
                self.stats.misses += 1
            else:
                self.stats.joined += 1
        assert future is not None
        if not owner:
            result, cacheable = future.result()  # the owner's exception is raised here too
            if not cacheable:  # a live page: each visit renders it again, as without a cache
                return self._render_uncached(render)
            return replace(result, from_cache=True, elapsed_s=elapsed())
        try:
            result, cacheable = render()
        except BaseException as exc:
            with self._lock:
                self._inflight.pop(key, None)
            future.set_exception(exc)
            raise
        with self._lock:
            self._inflight.pop(key, None)
            if cacheable:
                self._keep(key, result)
            else:
                self.stats.uncacheable += 1
        future.set_result((result, cacheable))
        return result

    def _render_uncached(self, render: Callable[[], tuple[FetchResult, bool]]) -> FetchResult:
        return render()[0]

    def _keep(self, key: str, result: FetchResult, persist: bool = True) -> None:
        size = len(result.text.encode("utf-8", errors="replace"))
        if size > self.max_bytes:
            return
        if persist and self.path is not None:
            self._append(key, result)
        old = self._entries.pop(key, None)
        if old is not None:
            self._nbytes -= old[1]
        self._entries[key] = (result, size)
        self._nbytes += size
        while len(self._entries) > self.max_entries or self._nbytes > self.max_bytes:
            _, (_, evicted) = self._entries.popitem(last=False)
            self._nbytes -= evicted
            self.stats.evictions += 1

    def _append(self, key: str, result: FetchResult) -> None:
        """One line per render, written with a single ``write`` in append mode (called under the lock)."""
        assert self.path is not None
        line = (json.dumps({"key": key, "result": result.to_cache()}, ensure_ascii=False) + "\n").encode("utf-8")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a+b") as f:
                if f.seek(0, os.SEEK_END) > 0:
                    f.seek(-1, os.SEEK_END)
                    if f.read(1) != b"\n":  # a line cut short by a crash: start on a line of our own
                        line = b"\n" + line
                f.write(line)
        except OSError:  # a read-only world folder: the render still serves this cache
            self.stats.write_errors += 1
