"""The offline search backend: a tantivy (BM25) index of a folder of HTML pages."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import tantivy

from .base import ToolError
from .search_common import (
    _WS_RE,
    SNIPPET_CHARS,
    SearchHit,
    _strip_tags,
    _url_host,
    host_matches,
    normalize_site,
)

__all__ = ["TantivyIndex", "default_url_path", "meta_description"]

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


