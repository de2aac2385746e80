"""Search types shared by the backends and the tool: hits, the backend protocol, URL/site helpers."""

from __future__ import annotations

import html as html_lib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable
from urllib.parse import urlsplit, urlunsplit

__all__ = ["SearchHit", "SearchBackend", "dedup_url", "normalize_site", "host_matches", "SNIPPET_CHARS"]

SNIPPET_CHARS = 240


@dataclass(frozen=True)
class SearchHit:
    """One search result. ``score`` is backend-specific (BM25 for the index); higher is better."""

    title: str
    url: str
    snippet: str
    score: float


@runtime_checkable
class SearchBackend(Protocol):
    """A search engine. ``search`` returns at most ``k`` hits, best first, and raises
    ``ToolError("backend" | "timeout", ...)`` when the engine fails.

    ``name`` identifies the engine and its corpus in cache keys. An optional class attribute
    ``remote = False`` tells :class:`SearchTool` that several queries need no threads (local, fast).
    """

    name: str

    def search(self, query: str, *, sites: list[str] | None, k: int) -> list[SearchHit]: ...


# ----------------------------------------------------------------------------- URL helpers

_SITE_RE = re.compile(r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$")


def dedup_url(url: str) -> str:
    """The URL as a dedup key: scheme and host lower-cased, default port, fragment and trailing slash dropped."""
    try:
        parts = urlsplit(url.strip())
        scheme = parts.scheme.lower()
        netloc = parts.netloc.lower()
    except ValueError:
        return url.strip()
    if (scheme == "http" and netloc.endswith(":80")) or (scheme == "https" and netloc.endswith(":443")):
        netloc = netloc.rsplit(":", 1)[0]
    path = parts.path.rstrip("/")
    return urlunsplit((scheme, netloc, path, parts.query, ""))


def normalize_site(site: str) -> str:
    """``"https://www.Example.org:8080/wiki"`` -> ``"example.org"``; raises ValueError when not a host name."""
    s = site.strip().lower()
    if "://" in s:
        s = s.split("://", 1)[1]
    s = s.split("/", 1)[0].split("?", 1)[0].split("#", 1)[0]
    s = s.rsplit("@", 1)[-1]
    if s.count(":") == 1:
        s = s.split(":", 1)[0]
    s = s.strip(".")
    if s.startswith("www."):
        s = s[4:]
    if not s or not _SITE_RE.match(s):
        raise ValueError(f"not a host name: {site!r}")
    return s


def host_matches(host: str, sites: Sequence[str]) -> bool:
    """True when ``host`` is one of ``sites`` or a subdomain of one (sites already normalised)."""
    host = host.lower().rstrip(".")
    return any(host == s or host.endswith("." + s) for s in sites)


def _url_host(url: str) -> str:
    try:
        return (urlsplit(url).hostname or "").lower()
    except ValueError:
        return ""


def _filter_sites(hits: list[SearchHit], sites: list[str] | None) -> list[SearchHit]:
    if not sites:
        return hits
    return [h for h in hits if host_matches(_url_host(h.url), sites)]


def _site_terms(query: str, sites: list[str] | None) -> str:
    """Append ``site:`` operators (``OR`` between several) for engines that understand them."""
    if not sites:
        return query
    return f"{query} " + " OR ".join(f"site:{s}" for s in sites)


_TAG_RE = re.compile(r"<[^>]+>")
_WS_RE = re.compile(r"\s+")


def _strip_tags(text: str) -> str:
    return _WS_RE.sub(" ", html_lib.unescape(_TAG_RE.sub("", text or ""))).strip()


