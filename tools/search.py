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

import contextlib
import hashlib
import html as html_lib
import json
import os
import re
import shutil
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable
from urllib.parse import quote, urlsplit, urlunsplit

import httpx
import tantivy

from .base import BaseTool, ToolError, ToolResult, require_str_list
from .cache import ResponseCache

__all__ = [
    "SearchHit",
    "SearchBackend",
    "TantivyIndex",
    "SearxngBackend",
    "BraveSearchBackend",
    "SearchTool",
    "normalize_url",
    "normalize_site",
    "host_matches",
    "default_url_path",
    "meta_description",
]

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


def normalize_url(url: str) -> str:
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


# ----------------------------------------------------------------------------- local index

_INDEX_META = "mgrpo_index.json"
_INDEX_FORMAT = 1
_LINK_MARKER_RE = re.compile(r" ?\[\d+\]")
_HEADING_RE = re.compile(r"(?m)^#{1,6} ")
_META_TAG_RE = re.compile(r"<meta\b[^>]*>", re.IGNORECASE)
_ATTR_RE = re.compile(r"""([a-zA-Z:-]+)\s*=\s*("([^"]*)"|'([^']*)'|([^\s>]+))""")
_TITLE_RE = re.compile(r"<title[^>]*>(.*?)</title>", re.IGNORECASE | re.DOTALL)
_LOCAL_HOST = "@local"  # host field value of pages whose URL is url_prefix + path
_FIELD_BOOSTS = {"title": 3.0, "description": 1.5, "body": 1.0, "path": 0.5}
_QUERY_JUNK_RE = re.compile(r'(?:[^\w\s"]|_)+')
_STOPWORDS = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "by",
        "for",
        "from",
        "in",
        "is",
        "it",
        "of",
        "on",
        "or",
        "the",
    ]
    + ["to", "was", "were", "what", "which", "who", "with"]
)
_SITE_OP_RE = re.compile(r"(?i)(?:^|\s)site:\s*([^\s\"'()]+)")


def _analyzer(stem: bool) -> Any:
    builder = (
        tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple())
        .filter(tantivy.Filter.remove_long(40))
        .filter(tantivy.Filter.lowercase())
        .filter(tantivy.Filter.ascii_fold())
    )
    if stem:
        builder = builder.filter(tantivy.Filter.stemmer("english"))
    return builder.build()


def _register_tokenizers(index: Any) -> None:
    index.register_tokenizer("mgrpo_text", _analyzer(stem=False))
    index.register_tokenizer("mgrpo_stem", _analyzer(stem=True))


def _schema() -> Any:
    sb = tantivy.SchemaBuilder()
    sb.add_text_field("title", stored=True, tokenizer_name="mgrpo_text")
    sb.add_text_field("description", stored=True, tokenizer_name="mgrpo_stem")
    sb.add_text_field("body", stored=True, tokenizer_name="mgrpo_stem")
    sb.add_text_field("path", stored=True, tokenizer_name="mgrpo_text")
    sb.add_text_field("host", stored=True, tokenizer_name="raw", index_option="basic")
    return sb.build()


def default_url_path(rel_path: str) -> str:
    """``"wiki/Velmora_Press.html"`` -> ``"/wiki/Velmora_Press"`` (percent-encoded where needed)."""
    rel = rel_path.replace(os.sep, "/")
    if rel.lower().endswith(".html"):
        rel = rel[: -len(".html")]
    return "/" + quote(rel.lstrip("/"), safe="/-_.~!$&'()*+,;=:@")


def meta_description(html: str) -> str:
    """The content of ``<meta name="description">`` (or ``og:description``), unescaped; "" if absent."""
    found = ""
    for tag in _META_TAG_RE.findall(html[:200_000]):
        attrs = {
            m.group(1).lower(): (m.group(3) or m.group(4) or m.group(5) or "") for m in _ATTR_RE.finditer(tag)
        }
        key = (attrs.get("name") or attrs.get("property") or "").lower()
        if key == "description":
            return _strip_tags(attrs.get("content", ""))
        if key == "og:description" and not found:
            found = _strip_tags(attrs.get("content", ""))
    return found


def _clean_body(text: str) -> str:
    """Readable text without ``[n]`` link markers (they are for ``click``) and ``#`` heading marks."""
    return _HEADING_RE.sub("", _LINK_MARKER_RE.sub("", text))


class TantivyIndex:
    """A BM25 index of a folder of HTML pages, served as if from ``url_prefix``.

    Build once with :meth:`build`, open with ``TantivyIndex(index_dir, url_prefix=...)``.
    Fields: ``title`` (boost 3), ``description`` (``<meta name="description">``, boost 1.5; pages
    rendered by JavaScript are found through it), ``body`` (readable text, English stemming, boost 1),
    ``path`` (URL path words, boost 0.5); all ASCII-folded and lower-cased.

    ``search`` never raises on odd query text: operators and punctuation are dropped, balanced
    ``"quoted phrases"`` stay phrases, ``site:host`` words in the query act like ``sites``. Safe to
    call from many threads (each call takes its own searcher; tantivy releases the GIL while searching).
    """

    remote = False  # SearchTool runs several queries sequentially for a local backend

    def __init__(self, index_dir: str | Path, url_prefix: str = "http://127.0.0.1:8000") -> None:
        self.index_dir = Path(index_dir)
        if not self.index_dir.is_dir() or not tantivy.Index.exists(str(self.index_dir)):
            raise FileNotFoundError(
                f"no tantivy index in {self.index_dir} (build it with TantivyIndex.build)"
            )
        self.url_prefix = url_prefix.rstrip("/")
        self._prefix_host = _url_host(self.url_prefix)
        self._index = tantivy.Index.open(str(self.index_dir))
        _register_tokenizers(self._index)
        self._schema = self._index.schema
        self._text_analyzer = _analyzer(stem=False)
        self._stem_analyzer = _analyzer(stem=True)
        meta_path = self.index_dir / _INDEX_META
        meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
        self.num_docs = self._index.searcher().num_docs
        fingerprint = meta.get("fingerprint", "unknown")[:12]
        self.name = f"tantivy:{fingerprint}@{self.url_prefix}"

    # -- building

    @staticmethod
    def build(
        pages_dir: str | Path,
        index_dir: str | Path,
        *,
        glob: str = "**/*.html",
        url_path: Callable[[str], str] = default_url_path,
    ) -> None:
        """Index every page under ``pages_dir`` matching ``glob`` into ``index_dir`` (replaced if present).

        ``url_path(rel_path)`` maps a page's path relative to ``pages_dir`` (POSIX separators) to its URL
        path (``"/wiki/X"``), or to an absolute ``http(s)://`` URL for pages of another host. The index is
        built in a sibling temporary folder and moved into place, so a crash leaves no half index.
        Pages are added in sorted path order with one writer thread: the same pages give the same index.
        """
        from .html_text import html_to_document

        pages_dir = Path(pages_dir)
        index_dir = Path(index_dir)
        if not pages_dir.is_dir():
            raise FileNotFoundError(f"pages folder not found: {pages_dir}")
        index_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = index_dir.parent / f".{index_dir.name}.tmp-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            index = tantivy.Index(_schema(), path=str(tmp), reuse=False)
            _register_tokenizers(index)
            writer = index.writer(heap_size=64_000_000, num_threads=1)
            digest = hashlib.sha256()
            count = 0
            for page in sorted(p for p in pages_dir.glob(glob) if p.is_file()):
                rel = page.relative_to(pages_dir).as_posix()
                target = url_path(rel)
                html = page.read_bytes().decode("utf-8", errors="replace")
                if target.startswith(("http://", "https://")):
                    host, path, base = _url_host(target), target, target
                else:
                    host, path, base = (
                        _LOCAL_HOST,
                        "/" + target.lstrip("/"),
                        "http://index.invalid/" + target.lstrip("/"),
                    )
                try:
                    doc = html_to_document(html, base)
                except Exception as exc:
                    raise RuntimeError(f"cannot index {page}: {type(exc).__name__}: {exc}") from exc
                title = doc.title or _title_from_html(html) or Path(rel).stem.replace("_", " ")
                description = meta_description(html)
                body = _clean_body(doc.text)
                writer.add_document(
                    tantivy.Document(title=title, description=description, body=body, path=path, host=host)
                )
                digest.update(f"{path}\0{title}\0{len(body)}\n".encode())
                count += 1
            writer.commit()
            writer.wait_merging_threads()
            meta = {"format": _INDEX_FORMAT, "documents": count, "fingerprint": digest.hexdigest()}
            (tmp / _INDEX_META).write_text(json.dumps(meta))
            if index_dir.exists():
                shutil.rmtree(index_dir)
            os.replace(tmp, index_dir)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    # -- searching

    def search(self, query: str, *, sites: list[str] | None = None, k: int = 5) -> list[SearchHit]:
        """The ``k`` best pages for ``query``, restricted to ``sites`` (host suffixes) when given."""
        if k <= 0:
            return []
        sites = list(sites or [])
        for m in _SITE_OP_RE.finditer(query):
            with contextlib.suppress(ValueError):  # "site:" followed by junk is dropped
                sites.append(normalize_site(m.group(1)))
        query = _SITE_OP_RE.sub(" ", query)
        try:
            sites = sorted({normalize_site(s) for s in sites})
        except ValueError as exc:
            raise ToolError("arguments", f"'sites' must hold host names like 'example.org': {exc}") from exc
        text = _sanitize_query(query)
        if not text:
            return []
        searcher = self._index.searcher()
        text_query = self._text_query(text)
        final = text_query
        if sites:
            site_filter = self._site_filter(sites)
            final = tantivy.Query.boolean_query(
                [
                    (tantivy.Occur.Must, text_query),
                    (tantivy.Occur.Must, tantivy.Query.const_score_query(site_filter, 0.0)),
                ]
            )
        try:
            found = searcher.search(final, limit=k).hits
        except ValueError:
            return []
        if not found:
            return []
        terms = self._snippet_terms(text)
        hits: list[SearchHit] = []
        for score, address in found:
            doc = searcher.doc(address)
            title = doc.get_first("title") or ""
            path = doc.get_first("path") or "/"
            host = doc.get_first("host") or _LOCAL_HOST
            url = self.url_prefix + path if host == _LOCAL_HOST else path
            body = doc.get_first("body") or ""
            snippet = _snippet(body, terms) if terms else ""
            if not snippet:
                snippet = doc.get_first("description") or ""
            if not snippet:
                snippet = _snippet(body, [])
            hits.append(SearchHit(title=title, url=url, snippet=snippet, score=float(score)))
        hits.sort(key=lambda h: (-h.score, h.url))  # deterministic order among equal scores
        return hits

    def _text_query(self, text: str) -> Any:
        try:
            return self._index.parse_query(text, list(_FIELD_BOOSTS), field_boosts=_FIELD_BOOSTS)
        except ValueError:
            pass
        # Fallback: a disjunction of term queries, tokenised like each field.
        words = text.replace('"', " ")
        clauses = []
        for fieldname, boost in _FIELD_BOOSTS.items():
            analyzer = self._stem_analyzer if fieldname in ("body", "description") else self._text_analyzer
            for token in dict.fromkeys(analyzer.analyze(words)):
                term = tantivy.Query.term_query(self._schema, fieldname, token)
                clauses.append((tantivy.Occur.Should, tantivy.Query.boost_query(term, boost)))
        return tantivy.Query.boolean_query(clauses) if clauses else tantivy.Query.empty_query()

    def _snippet_terms(self, text: str) -> list[str]:
        """The query's stems ("founded" -> "found", which also finds "founding"), stopwords left out."""
        return sorted({t for t in self._stem_analyzer.analyze(text.replace('"', " ")) if t not in _STOPWORDS})

    def _site_filter(self, sites: list[str]) -> Any:
        clauses = []
        if host_matches(self._prefix_host, sites):
            clauses.append(tantivy.Query.term_query(self._schema, "host", _LOCAL_HOST))
        for site in sites:
            pattern = "(.*\\.)?" + site.replace(".", "\\.")
            clauses.append(tantivy.Query.regex_query(self._schema, "host", pattern))
        return tantivy.Query.boolean_query([(tantivy.Occur.Should, c) for c in clauses])

    def __repr__(self) -> str:
        return f"TantivyIndex({str(self.index_dir)!r}, url_prefix={self.url_prefix!r}, docs={self.num_docs})"


def _title_from_html(html: str) -> str:
    m = _TITLE_RE.search(html)
    return _strip_tags(m.group(1)) if m else ""


def _snippet(body: str, terms: list[str], size: int = SNIPPET_CHARS) -> str:
    """A window of ``body`` of about ``size`` characters holding the most distinct ``terms`` (as word
    prefixes; the earliest such window on ties); "" if no term occurs; the head of the body if ``terms``
    is empty. ``str.find`` on the lower-cased body: a regex is 5x slower on long pages."""
    start = 0
    if terms:
        lowered = body.lower()
        matches: list[tuple[int, str]] = []
        for term in terms:
            i, n = lowered.find(term), 0
            while i >= 0 and n < 50:
                if i == 0 or not lowered[i - 1].isalnum():
                    matches.append((i, term))
                    n += 1
                i = lowered.find(term, i + 1)
        if not matches:
            return ""
        matches.sort()
        best, best_count = matches[0][0], 0
        counts: dict[str, int] = {}
        j = 0  # matches[i:j] lie in the window starting at matches[i]
        for i, (pos, _) in enumerate(matches):
            while j < len(matches) and matches[j][0] < pos + size - 40:
                counts[matches[j][1]] = counts.get(matches[j][1], 0) + 1
                j += 1
            if len(counts) > best_count:
                best, best_count = pos, len(counts)
            term = matches[i][1]
            counts[term] -= 1
            if not counts[term]:
                del counts[term]
        start = max(0, best - 40)
        if start:
            space = body.find(" ", start)
            start = space + 1 if 0 <= space < best else start
    end = start + size
    if end < len(body):
        space = body.rfind(" ", start, end)
        end = space if space > start + size // 2 else end
    text = _WS_RE.sub(" ", body[start:end]).strip()
    return ("..." if start else "") + text + ("..." if end < len(body) else "")


def _sanitize_query(query: str) -> str:
    """Agent text -> a query the tantivy parser accepts: lower-case words and balanced ``"phrases"``.

    Lower-casing disarms ``AND``/``OR``/``NOT``; every other operator character (``: ( ) [ ] ^ ~ * - +``)
    becomes a space. Unbalanced quotes are dropped; empty phrases too.
    """
    text = _QUERY_JUNK_RE.sub(" ", query.lower())
    if text.count('"') % 2:
        text = text.replace('"', " ")
    text = re.sub(
        r'"([^"]*)"', lambda m: f' "{m.group(1).strip()}" ' if re.search(r"[^\W_]", m.group(1)) else " ", text
    )
    return _WS_RE.sub(" ", text).strip()


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

    The agent sees one merged numbered list ``[n] Title / URL: ... / snippet``; a result found by
    several queries appears once, at its best round-robin position.
    """

    name = "search"
    description = (
        "Search the web. Give 1 to 3 short keyword queries; results of all queries are merged into one "
        "numbered list of title, URL and snippet. Optionally restrict to sites (host names such as "
        "'example.org', subdomains included). Use visit(url, goal) to read a result."
    )
    parameters: dict[str, Any] = {
        "type": "object",
        "properties": {
            "queries": {
                "type": "array",
                "items": {"type": "string"},
                "minItems": 1,
                "maxItems": 3,
                "description": "1 to 3 search queries, e.g. ['Velmora Press founder'].",
            },
            "sites": {
                "type": "array",
                "items": {"type": "string"},
                "description": "Optional host names to restrict results to, e.g. ['example.org'].",
            },
        },
        "required": ["queries"],
        "additionalProperties": False,
    }
    MAX_QUERIES = 3
    MAX_SITES = 10
    SNIPPET_CHARS = 300

    def __init__(
        self, backend: SearchBackend, *, k: int = 5, max_results: int = 10, cache: ResponseCache | None = None
    ) -> None:
        if k < 1 or max_results < 1:
            raise ValueError("k and max_results must be at least 1")
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
                snippet = (
                    hit.snippet
                    if len(hit.snippet) <= self.SNIPPET_CHARS
                    else hit.snippet[: self.SNIPPET_CHARS].rstrip() + "..."
                )
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
                key = normalize_url(hits[rank].url)
                if key not in seen:
                    seen.add(key)
                    merged.append(hits[rank])
                    if len(merged) >= limit:
                        return merged
    return merged
