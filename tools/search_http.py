"""Search backends over HTTP: a SearxNG instance and the Brave Search web API."""

from __future__ import annotations

import os
from typing import Any

import httpx

from .base import ToolError
from .search_common import SearchHit, _filter_sites, _site_terms, _strip_tags

__all__ = ["SearxngBackend", "BraveSearchBackend"]

# ----------------------------------------------------------------------------- HTTP backends


def _http_get(
    client: httpx.Client, service: str, url: str, *, params: dict[str, Any], headers: dict[str, str]
) -> Any:
    """GET and decode JSON; map failures to ToolError("timeout" | "backend")."""
    try:
        response = client.get(url, params=params, headers=headers)
    except httpx.TimeoutException as exc:
        raise ToolError("timeout", f"{service} did not answer in time ({type(exc).__name__})") from exc
    except httpx.HTTPError as exc:
        raise ToolError("backend", f"{service} unreachable: {type(exc).__name__}: {exc}") from exc
    status = response.status_code
    if status == 429:
        raise ToolError("backend", f"{service} rate limit reached (HTTP 429); retry later", status=status)
    if status in (401, 403):
        raise ToolError("backend", f"{service} refused the credentials (HTTP {status})", status=status)
    if status >= 400:
        raise ToolError(
            "backend", f"{service} answered HTTP {status}: {response.text[:200]!r}", status=status
        )
    try:
        return response.json()
    except ValueError as exc:
        ctype = response.headers.get("content-type", "?")
        raise ToolError(
            "backend", f"{service} did not return JSON (content-type {ctype})", status=status
        ) from exc


class _HttpBackend:
    remote = True

    def __init__(self, timeout_s: float, client: httpx.Client | None) -> None:
        self.timeout_s = timeout_s
        self._own_client = client is None
        self._client = client or httpx.Client(timeout=timeout_s, follow_redirects=True)

    def close(self) -> None:
        if self._own_client:
            self._client.close()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SearxngBackend(_HttpBackend):
    """A SearxNG instance (``base_url`` like ``http://127.0.0.1:8888``); its JSON output must be enabled
    (``search.formats: [html, json]`` in settings.yml). ``sites`` become ``site:`` terms and results are
    also filtered by host, since not every engine honours ``site:``."""

    def __init__(self, base_url: str, *, timeout_s: float = 10.0, client: httpx.Client | None = None) -> None:
        super().__init__(timeout_s, client)
        self.base_url = base_url.rstrip("/")
        self.name = f"searxng:{self.base_url}"

    def search(self, query: str, *, sites: list[str] | None = None, k: int = 5) -> list[SearchHit]:
        params = {"q": _site_terms(query, sites), "format": "json", "pageno": 1}
        data = _http_get(
            self._client,
            "SearxNG",
            f"{self.base_url}/search",
            params=params,
            headers={"Accept": "application/json"},
        )
        results = data.get("results") if isinstance(data, dict) else None
        if not isinstance(results, list):
            raise ToolError("backend", "SearxNG response has no 'results' list")
        hits = []
        for rank, item in enumerate(results):
            if not isinstance(item, dict) or not isinstance(item.get("url"), str) or not item.get("url"):
                raise ToolError("backend", f"SearxNG result {rank} has no 'url'")
            score = item.get("score")
            hits.append(
                SearchHit(
                    title=_strip_tags(str(item.get("title") or item["url"])),
                    url=item["url"],
                    snippet=_strip_tags(str(item.get("content") or "")),
                    score=float(score) if isinstance(score, (int, float)) else 1.0 / (rank + 1),
                )
            )
        return _filter_sites(hits, sites)[:k]


class BraveSearchBackend(_HttpBackend):
    """The Brave Search web API. ``api_key`` defaults to the ``BRAVE_SEARCH_API_KEY`` environment variable.

    Brave returns no score: ``score`` is ``1 / rank``. At most 20 results per request (API limit).
    """

    name = "brave"
    ENV_VAR = "BRAVE_SEARCH_API_KEY"

    def __init__(
        self,
        api_key: str | None = None,
        *,
        base_url: str = "https://api.search.brave.com/res/v1/web/search",
        timeout_s: float = 10.0,
        client: httpx.Client | None = None,
    ) -> None:
        key = api_key or os.environ.get(self.ENV_VAR, "")
        if not key.strip():
            raise ValueError(f"Brave Search needs an API key: pass api_key= or set {self.ENV_VAR}")
        super().__init__(timeout_s, client)
        self._api_key = key.strip()
        self.base_url = base_url

    def search(self, query: str, *, sites: list[str] | None = None, k: int = 5) -> list[SearchHit]:
        params = {"q": _site_terms(query, sites), "count": max(1, min(int(k), 20))}
        headers = {"X-Subscription-Token": self._api_key, "Accept": "application/json"}
        data = _http_get(self._client, "Brave Search", self.base_url, params=params, headers=headers)
        if not isinstance(data, dict):
            raise ToolError("backend", "Brave Search response is not a JSON object")
        web = data.get("web") or {}
        results = web.get("results", []) if isinstance(web, dict) else None
        if not isinstance(results, list):
            raise ToolError("backend", "Brave Search response has no 'web.results' list")
        hits = []
        for rank, item in enumerate(results):
            if not isinstance(item, dict) or not isinstance(item.get("url"), str) or not item.get("url"):
                raise ToolError("backend", f"Brave Search result {rank} has no 'url'")
            hits.append(
                SearchHit(
                    title=_strip_tags(str(item.get("title") or item["url"])),
                    url=item["url"],
                    snippet=_strip_tags(str(item.get("description") or "")),
                    score=1.0 / (rank + 1),
                )
            )
        return _filter_sites(hits, sites)[:k]


