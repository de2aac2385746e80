"""A running wiki-hops world (:class:`WikiWorld`): the loopback site, URL policy, fetchers, browser,
search index and the agents' tools, opened by :meth:`mgrpo_scenarios.wiki_hops.WikiHops.open`.

Split from ``scenario.py`` by concern: that module builds and describes a world (pages, tasks, the
oracle), this one serves it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path

from mgrpo_tools.base import Tool

__all__ = ["ORIGIN", "WikiWorld"]

#: The stable origin agents see (a reserved ``.test`` name that never resolves); the tools map it to
#: the loopback site (``WikiWorld.served_url``) when they connect.
ORIGIN = "http://wiki-hops.test"


def _render_file(root: Path) -> Path:
    """``<world>/rendered/<browser>.jsonl``: renders of this world by this Chromium build (its path,
    size and modification time name the file, so an upgraded browser renders afresh)."""
    from mgrpo_tools.chromium import find_chromium

    found = find_chromium()
    if found is None:
        label = "none"
    else:
        real = os.path.realpath(found)
        stat = os.stat(real)
        label = hashlib.sha256(f"{real}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    return root / "rendered" / f"chromium-{label}.jsonl"


class WikiWorld:
    """A running wiki-hops world: loopback site, URL policy, fetchers, search index and tools.

    Attributes:
        url: the stable base URL agents see, :data:`ORIGIN` (``http://wiki-hops.test``); the tools
            map it to the loopback site.
        served_url: where the site really is (``http://127.0.0.1:PORT``, a new port every run), for
            a client outside the tools (a person's browser, a benchmark's bare HTTP client).
        tools: a ready tool set ``{"search", "visit", "click"}``; :meth:`make_tools` gives another one
            with its own browsing session (the fetchers, browser and index are shared).
        render_cache: the browser's cache of rendered pages (:mod:`mgrpo_tools.render_cache`), or
            None when built with ``render_cache=False`` (every visit of a JavaScript page renders it).
    """

    def __init__(self, root: Path, *, host: str = "127.0.0.1", browser_mode: str = "auto", page_chars: int = 4000, search_k: int = 5,
                 cache_path: Path | None = None, snippet_chars: int = 300, goal_lines: int = 0,
                 links: bool = True, evidence_only: bool = False, render_cache: bool = True) -> None:
        from mgrpo_tools.browser import BrowserFetcher
        from mgrpo_tools.cache import ResponseCache
        from mgrpo_tools.fetch import HttpFetcher
        from mgrpo_tools.render_cache import RenderCache
        from mgrpo_tools.search import SearchTool, TantivyIndex
        from mgrpo_tools.url_policy import UrlPolicy
        from mgrpo_tools.webserver import LoopbackSite

        self.root = root
        self.browser_mode = browser_mode
        self.page_chars = page_chars
        self.goal_lines = goal_lines
        self.links = links
        self.evidence_only = evidence_only
        self.cache = None
        self.render_cache = None
        self.site = None
        self.http = None
        self.browser = None
        try:
            self.cache = ResponseCache(cache_path) if cache_path is not None else None
            self.site = LoopbackSite(root / "pages", host=host, title_prefixes=("/wiki/",)).start()
            self.url = ORIGIN
            self.served_url = self.site.url
            self.policy = UrlPolicy()
            # Agents (and so the cache, the index and every page's links) see only ORIGIN.
            self.policy.map_origin(ORIGIN, self.served_url)
            # The pages are files that never change while the world is open: each is fetched over HTTP
            # once per open world, every later read (K rollouts of a group read the same pages) from memory.
            self.http = HttpFetcher(self.policy, cache=self.cache,
                                    static_cache=RenderCache() if render_cache else None)
            # BrowserFetcher starts Chromium on its first fetch only: worlds that never meet a
            # JavaScript page never launch a browser. The site is static files (a built world folder
            # never changes) and its scripts are deterministic, so each page is rendered once per
            # world and browser, and kept in the world folder for every later open (mgrpo_tools.render_cache).
            self.render_cache = RenderCache(path=_render_file(root)) if render_cache else None
            self.browser = (BrowserFetcher(self.policy, cache=self.cache, render_cache=self.render_cache)
                            if browser_mode != "never" else None)
            self.index = TantivyIndex(root / "index", url_prefix=ORIGIN)
            self.search = SearchTool(self.index, k=search_k, max_results=max(10, search_k), cache=self.cache,
                                     snippet_chars=snippet_chars)
            self.tools = self.make_tools()
        except BaseException:
            self.close()
            raise

    def script_pages(self) -> list[str]:
        """The URLs (under :data:`ORIGIN`) of the pages that carry a script, in file order."""
        pages = self.root / "pages"
        out = []
        for path in sorted(pages.rglob("*.html")):
            if b"<script" in path.read_bytes():
                out.append(f"{self.url}/{path.relative_to(pages).with_suffix('').as_posix()}")
        return out

    def prerender(self, workers: int = 4) -> dict[str, int]:
        """Visit every page with a script that the render cache does not hold yet, ``workers`` at a
        time, through the agents' own ``visit`` tool (so the same pages are rendered under the same
        keys); returns ``{"pages": .., "rendered": .., "failed": ..}``. A page that fails is only
        counted: an agent's visit will try it again and see the error itself."""
        from concurrent.futures import ThreadPoolExecutor

        cache = self.render_cache
        pages = self.script_pages()
        # the browser keys a render by the policy-checked URL: a page already kept is not visited again
        urls = [u for u in pages if cache is None or self.policy.check(u, resolve=False) not in cache]
        before = cache.stats.misses if cache is not None else 0

        def visit(url: str) -> bool:
            return bool(self.make_tools()["visit"]({"url": url, "goal": "prerender"}).ok)

        with ThreadPoolExecutor(max(1, workers)) as pool:
            ok = list(pool.map(visit, urls))
        rendered = (cache.stats.misses - before) if cache is not None else 0
        return {"pages": len(pages), "rendered": rendered, "failed": ok.count(False)}

    def make_tools(self) -> dict[str, Tool]:
        """A fresh ``{"search", "visit", "click"}`` set with its own browsing session."""
        from mgrpo_tools.visit import make_browsing_tools

        assert self.http is not None
        browsing = make_browsing_tools(self.http, self.browser, self.browser_mode, self.page_chars,
                                       goal_lines=self.goal_lines, links=self.links,
                                       evidence_only=self.evidence_only)
        return {"search": self.search, **browsing}

    def close(self) -> None:
        """Stop the browser, the fetcher, the site and the cache; safe to call twice."""
        for closer in (
            (self.browser.close if self.browser is not None else None),
            (self.http.close if self.http is not None else None),
            (self.site.stop if self.site is not None else None),
            (self.cache.close if self.cache is not None else None),
        ):
            if closer is not None:
                with contextlib.suppress(Exception):  # closing the rest matters more
                    closer()
        self.browser = self.http = None
        self.cache = None
        if self.site is not None:
            self.site = None

    def __enter__(self) -> WikiWorld:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
