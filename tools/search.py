"""Web search for agents: a local tantivy index, HTTP backends, and the ``search`` tool.

Backends implement :class:`SearchBackend` (``name`` and ``search(query, *, sites, k)``):

* :class:`TantivyIndex` - the offline default: a BM25 index of a folder of HTML pages (the
  scenario's loopback world), title boosted over body, hits pointing at ``url_prefix`` + page path.
* :class:`SearxngBackend` - a SearxNG instance's JSON API (``/search?format=json``).
* :class:`BraveSearchBackend` - the Brave Search web API (key in ``BRAVE_SEARCH_API_KEY``).

:class:`SearchTool` is what the sub-agent calls: ``{"queries": [1-3 strings], "sites": [...]}``.
It runs every query, merges the ranked lists round-robin (rank 1 of each query, then rank 2, ...),
drops duplicate URLs, and shows one numbered list. Results can be cached in a
:class:`~mgrpo_tools.cache.ResponseCache` per (backend, query, sites, k).

``sites`` restricts results by host suffix: ``example.org`` matches ``example.org`` and
``a.example.org`` (a leading ``www.``, a scheme, a port or a path in a site are ignored).
"""


from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from typing import Any

from . import schemas
from .base import BaseTool, ToolError, ToolResult, require_str_list
from .cache import ResponseCache
from .search_common import (
    _WS_RE,
    SearchBackend,
    SearchHit,
    dedup_url,
    host_matches,
    normalize_site,
)
from .search_http import BraveSearchBackend, SearxngBackend
from .search_index import TantivyIndex, default_url_path, meta_description

__all__ = [
    "SearchHit",
    "SearchBackend",
    "TantivyIndex",
    "SearxngBackend",
    "BraveSearchBackend",
    "SearchTool",
    "dedup_url",
    "normalize_site",
    "host_matches",
    "default_url_path",
    "meta_description",
]

# ----------------------------------------------------------------------------- the tool


def _cache_query(query: str) -> str:
    return _WS_RE.sub(" ", query.lower()).strip()


class SearchTool(BaseTool):
    """The agent's ``search`` tool over any :class:`SearchBackend`.

    Args:
        backend: the search engine.
        k: results asked of the backend per query.
        max_results: most results shown after merging (round-robin by rank) and URL dedup.
        cache: optional response cache (namespace ``"search"``, key: backend name, normalised query,
            sorted sites, k). Failed queries are not cached.
        snippet_chars: longest snippet shown per result (longer ones are cut with "..."); 0 shows
            titles and URLs only (compact results for small models).

    The agent sees one merged numbered list ``[n] Title / URL: ... / snippet``; a result found by
    several queries appears once, at its best round-robin position.
    """

    name = "search"
    # what the agent is shown and its arguments are checked against: tools/schemas.py, one copy
    description = schemas.SEARCH.description
    parameters: dict[str, Any] = schemas.SEARCH.parameters
    MAX_QUERIES = 3
    MAX_SITES = 10
    SNIPPET_CHARS = 300

    def __init__(
        self, backend: SearchBackend, *, k: int = 5, max_results: int = 10, cache: ResponseCache | None = None,
        snippet_chars: int = SNIPPET_CHARS,
    ) -> None:
        if k < 1 or max_results < 1:
            raise ValueError("k and max_results must be at least 1")
        if snippet_chars < 0:
            raise ValueError("snippet_chars must be >= 0")
        self.snippet_chars = snippet_chars
        self.backend = backend
        self.k = k
        self.max_results = max_results
        self.cache = cache
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    def run(self, arguments: Mapping[str, Any]) -> ToolResult:
        unknown = sorted(set(arguments) - {"queries", "sites"})
        if unknown:
            hint = " (use 'queries', a list of strings)" if "query" in unknown else ""
            raise ToolError(
                "arguments",
                f"unknown argument(s) {unknown}; search takes 'queries' and optional 'sites'{hint}",
            )
        queries = require_str_list(arguments, "queries", min_items=1, max_items=self.MAX_QUERIES)
        assert queries is not None
        queries = list(dict.fromkeys(queries))  # the same query twice is run once
        raw_sites = require_str_list(
            arguments, "sites", min_items=0, max_items=self.MAX_SITES, max_len=253, required=False
        )
        sites: list[str] | None = None
        if raw_sites:
            try:
                sites = sorted({normalize_site(s) for s in raw_sites})
            except ValueError as exc:
                raise ToolError(
                    "arguments", f"'sites' must hold host names like 'example.org': {exc}"
                ) from exc

        outcomes = self._run_queries(queries, sites)
        errors = [(q, o) for q, o in zip(queries, outcomes, strict=True) if isinstance(o, ToolError)]
        if len(errors) == len(queries):
            first = errors[0][1]
            assert isinstance(first, ToolError)
            raise first
        lists = [o[0] if isinstance(o, tuple) else [] for o in outcomes]
        merged = _merge_round_robin(lists, self.max_results)
        per_query = []
        for q, o in zip(queries, outcomes, strict=True):
            if isinstance(o, ToolError):
                per_query.append(
                    {"query": q, "count": 0, "from_cache": False, "error": f"{o.kind}: {o.message}"}
                )
            else:
                per_query.append({"query": q, "count": len(o[0]), "from_cache": o[1]})
        text = self._format(queries, sites, merged, errors)
        meta = {
            "hits": [asdict(h) for h in merged],
            "per_query": per_query,
            "from_cache": all(p["from_cache"] for p in per_query),
            "backend": self.backend.name,
            "sites": sites,
        }
        return ToolResult(text=text, meta=meta)

    def _run_queries(
        self, queries: list[str], sites: list[str] | None
    ) -> list[tuple[list[SearchHit], bool] | ToolError]:
        if len(queries) > 1 and getattr(self.backend, "remote", True):
            with self._pool_lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(max_workers=self.MAX_QUERIES, thread_name_prefix="search")
            return list(self._pool.map(lambda q: self._one_query(q, sites), queries))
        return [self._one_query(q, sites) for q in queries]

    def _one_query(self, query: str, sites: list[str] | None) -> tuple[list[SearchHit], bool] | ToolError:
        request = {
            "backend": self.backend.name,
            "query": _cache_query(query),
            "sites": sites or [],
            "k": self.k,
        }
        try:
            if self.cache is not None:
                cached = self.cache.get("search", request)
                if cached is not None:
                    return [SearchHit(**h) for h in cached["hits"]], True
            hits = list(self.backend.search(query, sites=sites, k=self.k))[: self.k]
            if self.cache is not None:
                self.cache.put("search", request, {"hits": [asdict(h) for h in hits]})
            return hits, False
        except ToolError as exc:
            return exc

    def _format(
        self,
        queries: list[str],
        sites: list[str] | None,
        hits: list[SearchHit],
        errors: list[tuple[str, Any]],
    ) -> str:
        quoted = " | ".join(json.dumps(q, ensure_ascii=False) for q in queries)
        scope = f" on {', '.join(sites)}" if sites else ""
        lines: list[str] = []
        if not hits:
            lines.append(
                f"No results found for {quoted}{scope}. Try other keywords, fewer words, or no site filter."
            )
        else:
            lines.append(f"Search results for {quoted}{scope} ({len(hits)} results):")
            for n, hit in enumerate(hits, 1):
                limit = self.snippet_chars
                snippet = hit.snippet if len(hit.snippet) <= limit else hit.snippet[:limit].rstrip() + "..." if limit else ""
                if limit:
                    lines.append("")
                lines.append(f"[{n}] {hit.title or '(untitled)'}")
                lines.append(f"URL: {hit.url}")
                if snippet:
                    lines.append(snippet)
        for q, exc in errors:
            lines.append("")
            lines.append(f"(query {json.dumps(q, ensure_ascii=False)} failed: {exc.kind}: {exc.message})")
        return "\n".join(lines)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None


def _merge_round_robin(lists: list[list[SearchHit]], limit: int) -> list[SearchHit]:
    """Rank 1 of each list in order, then rank 2, ...; the first occurrence of a URL wins."""
    merged: list[SearchHit] = []
    seen: set[str] = set()
    depth = max((len(hits) for hits in lists), default=0)
    for rank in range(depth):
        for hits in lists:
            if rank < len(hits):
                key = dedup_url(hits[rank].url)
                if key not in seen:
                    seen.add(key)
                    merged.append(hits[rank])
                    if len(merged) >= limit:
                        return merged
    return merged

