"""The ``visit`` and ``click`` tools: read a web page as paginated text and follow its numbered links.

``visit(url, goal, page?)`` fetches a page (plain HTTP, or headless Chromium when the page needs
JavaScript), turns it into readable text with numbered links (:mod:`.html_text`) and shows one page
of it, preceded by the agent's goal. ``click(link)`` follows a link of the last visited page, by its
number or its exact anchor text, through the same fetchers and URL policy.

Each agent gets its own :class:`BrowsingSession` (the last page it read); the fetchers, their
connection pools, the browser and the cache are shared. :func:`make_browsing_tools` builds the pair
for one agent.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from . import schemas
from .base import BaseTool, ToolError, ToolResult, optional_int, require_str
from .browser import BrowserFetcher
from .fetch import FetchResult, HttpFetcher
from .html_text import Document, Link, html_to_document, relevant_lines, render_page
from .url_policy import normalize_url

__all__ = ["BrowsingSession", "VisitTool", "ClickTool", "make_browsing_tools", "BROWSER_MODES"]

BROWSER_MODES = ("auto", "never", "always")
# In "auto" mode a page whose readable text is shorter than this, and that has scripts, is rendered.
MIN_TEXT_CHARS = 40
MAX_PAGE_NUMBER = 10_000
_HTML_TYPES = ("text/html", "application/xhtml+xml", "")


@dataclass
class BrowsingSession:
    """What one agent is reading: the last visited document, its page and the goal it gave.

    Attributes:
        document: the last page read, or None before the first visit.
        requested_url: the normalised URL the agent asked for (a redirect may change ``document.url``).
        page: the page number shown last.
        pages: how many pages the document has.
        goal: the goal of the last visit (``click`` reuses it).
        fetch: the fetch result behind ``document``.
    """

    document: Document | None = None
    requested_url: str = ""
    page: int = 0
    pages: int = 0
    goal: str = ""
    fetch: FetchResult | None = None

    def reset(self) -> None:
        """Forget the current page (a new episode)."""
        self.document, self.requested_url, self.page, self.pages, self.goal, self.fetch = (
            None,
            "",
            0,
            0,
            "",
            None,
        )

    def same_page(self, url: str) -> bool:
        """True when ``url`` names the page in the session (as asked for or after redirects)."""
        if self.document is None:
            return False
        try:
            wanted = normalize_url(url)
            return wanted in (self.requested_url, normalize_url(self.document.url))
        except ToolError:
            return False


class DocumentMemo:
    """Parsed pages by ``(url, html)``, least recently used dropped first, bounded twice: by entries
    and by the characters of HTML kept (each entry holds its HTML, as the key, and its Document).

    Parsing is ~90% of a cached visit and many agents read the same pages, so parsed documents are
    shared; they are never mutated after parsing. The bound in characters is what keeps a long run
    flat: the ``functools.lru_cache(maxsize=1024)`` this replaces counted entries only, and 1,024
    pages of up to 200,000 characters can hold ~550 MB. Measured with tracemalloc, the HTML
    included: an entry costs ~2.7 bytes per character of HTML for a large text page and ~4.4 for
    wiki-hops' small, link-dense pages (306 pages, 586,000 characters: 2.6 MB), so the default
    bound of 8,000,000 characters holds at most ~35 MB (``tests/test_soak_leaks.py`` checks the
    bound).
    """

    def __init__(self, max_entries: int = 1024, max_chars: int = 8_000_000, max_page_chars: int = 200_000) -> None:
        self.max_entries, self.max_chars, self.max_page_chars = max_entries, max_chars, max_page_chars
        self._entries: OrderedDict[tuple[str, str], Document] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def chars(self) -> int:
        """Characters of HTML kept now."""
        return self._chars

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._chars = 0

    def parse(self, text: str, url: str) -> Document:
        """The Document of ``text`` at ``url``: a kept one, or parsed now (and kept if small enough)."""
        if len(text) > self.max_page_chars:
            return html_to_document(text, url)
        key = (url, text)
        with self._lock:
            doc = self._entries.get(key)
            if doc is not None:
                self._entries.move_to_end(key)
                return doc
        doc = html_to_document(text, url)  # outside the lock: two threads may parse one page at once
        with self._lock:
            if key not in self._entries:
                self._entries[key] = doc
                self._chars += len(text)
            while len(self._entries) > self.max_entries or self._chars > self.max_chars:
                (_, old_text), _ = self._entries.popitem(last=False)
                self._chars -= len(old_text)
        return doc


#: The memo every visit tool of the process shares (see DocumentMemo for its bounds).
DOCUMENTS = DocumentMemo()


def _to_document(result: FetchResult) -> Document:
    """HTML through the readable-text extractor; other text (plain, JSON, XML) as it is."""
    if result.content_type in _HTML_TYPES:
        return DOCUMENTS.parse(result.text, result.url)
    name = result.url.rstrip("/").rsplit("/", 1)[-1] or result.url
    return Document(url=result.url, title=name, text=result.text.strip(), links=[])


def _needs_browser(result: FetchResult, doc: Document) -> bool:
    """Little readable text but scripts: the content is probably built by JavaScript."""
    return len(doc.text.strip()) < MIN_TEXT_CHARS and "<script" in result.text.lower()


class VisitTool(BaseTool):
    """``visit(url, goal, page=1)``: read one page of a web page's text.

    Args:
        http: the plain HTTP fetcher (also carries the URL policy).
        browser: the Chromium fetcher, needed for ``browser_mode`` ``"always"`` and used by ``"auto"``.
        browser_mode: ``"never"`` (HTTP only), ``"always"`` (browser only), or ``"auto"`` (HTTP, and
            the browser for pages whose text is nearly empty while they carry scripts).
        page_chars: characters per page of text shown to the agent.
        session: this agent's session; a fresh one when omitted.
        goal_lines: when above 0, the result starts with up to that many lines of the page that
            match the goal best (:func:`~.html_text.relevant_lines`), before the goal and the page,
            as the goal-directed visit tools of deep-research agents return relevant evidence first.
        links: False leaves out link numbers and the ``Links:`` list (compact text for small models).
        evidence_only: with ``goal_lines``, show only the matching lines when there are any (the page
            itself only when nothing matches), as visit tools that summarise a page for the goal do.
    """

    name = "visit"
    # what the agent is shown and its arguments are checked against: tools/schemas.py, one copy
    description = schemas.VISIT.description
    parameters = schemas.VISIT.parameters

    def __init__(
        self,
        http: HttpFetcher,
        browser: BrowserFetcher | None = None,
        *,
        browser_mode: str = "auto",
        page_chars: int = 4000,
        session: BrowsingSession | None = None,
        goal_lines: int = 0,
        links: bool = True,
        evidence_only: bool = False,
    ) -> None:
        if browser_mode not in BROWSER_MODES:
            raise ValueError(f"browser_mode must be one of {BROWSER_MODES}, got {browser_mode!r}")
        if browser_mode == "always" and browser is None:
            raise ValueError("browser_mode='always' needs a BrowserFetcher")
        if page_chars < 200:
            raise ValueError("page_chars must be at least 200")
        self.http = http
        self.browser = browser
        self.browser_mode = browser_mode
        self.page_chars = page_chars
        self.goal_lines = goal_lines
        self.links = links
        self.evidence_only = evidence_only
        self.session = session if session is not None else BrowsingSession()

    def run(self, arguments: Mapping[str, Any]) -> ToolResult:
        url = require_str(arguments, "url", max_len=self.http.policy.max_url_length)
        goal = require_str(arguments, "goal", max_len=1000)
        page = optional_int(arguments, "page", 1, low=1, high=MAX_PAGE_NUMBER)
        return self.open(url, goal, page)

    def open(self, url: str, goal: str, page: int = 1) -> ToolResult:
        """Show ``page`` of ``url``; reuses the session's document when it is the same page."""
        session = self.session
        meta_extra: dict[str, Any] = {}
        if session.same_page(url) and session.fetch is not None and session.document is not None:
            result, doc = session.fetch, session.document  # reading on: no second download
        else:
            result, doc, meta_extra = self._load(url)
        text, pages = render_page(doc, page, self.page_chars, links=self.links)
        session.document, session.fetch = doc, result
        session.requested_url = normalize_url(url)
        session.page, session.pages, session.goal = page, pages, goal
        meta = {
            "url": result.url,
            "status": result.status,
            "via": result.via,
            "from_cache": result.from_cache,
            "page": page,
            "pages": pages,
            **meta_extra,
        }
        text = f"Goal: {goal}\n{text}"
        if self.goal_lines > 0:
            found = relevant_lines(doc, goal, self.goal_lines)
            meta["relevant_lines"] = len(found)
            if found and self.evidence_only:
                text = "\n".join(found)
            elif found:
                text = "\n".join(found) + "\n\n" + text
        return ToolResult(text=text, meta=meta)

    def _load(self, url: str) -> tuple[FetchResult, Document, dict[str, Any]]:
        if self.browser_mode == "always":
            assert self.browser is not None
            result = self.browser.fetch(url)
            return result, _to_document(result), {}
        result = self.http.fetch(url)
        doc = _to_document(result)
        if self.browser_mode == "auto" and self.browser is not None and _needs_browser(result, doc):
            try:
                rendered = self.browser.fetch(result.url)
            except ToolError as exc:
                # The plain page is still worth showing; say why it was not rendered.
                return result, doc, {"browser_error": f"{exc.kind}: {exc.message}"}
            return rendered, _to_document(rendered), {}
        return result, doc, {}


class ClickTool(BaseTool):
    """``click(link)``: follow a link of the last visited page, by number or exact anchor text.

    Shares the :class:`VisitTool`'s session, fetchers and URL policy.
    """

    name = "click"
    description = schemas.CLICK.description
    parameters = schemas.CLICK.parameters

    def __init__(self, visit: VisitTool) -> None:
        self.visit = visit

    def run(self, arguments: Mapping[str, Any]) -> ToolResult:
        session = self.visit.session
        if session.document is None:
            raise ToolError("arguments", "no page visited yet: call visit(url, goal) first")
        link = self._find(session.document, arguments)
        result = self.visit.open(link.url, session.goal or f"follow link '{link.text}'")
        result.meta["clicked"] = link.number
        return result

    @staticmethod
    def _find(doc: Document, arguments: Mapping[str, Any]) -> Link:
        if "link" not in arguments or arguments["link"] is None:
            raise ToolError("arguments", "missing required argument 'link'")
        value = arguments["link"]
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ToolError(
                "arguments", f"'link' must be a link number or anchor text, got {type(value).__name__}"
            )
        if isinstance(value, float):
            if not value.is_integer():
                raise ToolError("arguments", f"'link' must be a whole number, got {value}")
            value = int(value)
        if isinstance(value, str):
            text = value.strip()
            if not text:
                raise ToolError("arguments", "'link' must not be empty")
            digits = text[1:-1] if text.startswith("[") and text.endswith("]") else text
            if not digits.isdigit():
                return ClickTool._by_text(doc, text)
            value = int(digits)
        for link in doc.links:
            if link.number == value:
                return link
        if not doc.links:
            raise ToolError("arguments", f"the current page ({doc.url}) has no links")
        raise ToolError(
            "arguments", f"no link [{value}] on the current page (links are numbered 1 to {len(doc.links)})"
        )

    @staticmethod
    def _by_text(doc: Document, text: str) -> Link:
        wanted = " ".join(text.split())
        for exact in (True, False):
            for link in doc.links:
                have = " ".join(link.text.split())
                if have == wanted if exact else have.casefold() == wanted.casefold():
                    return link
        raise ToolError("arguments", f"no link with the anchor text {text!r} on the current page ({doc.url})")


def make_browsing_tools(
    http: HttpFetcher,
    browser: BrowserFetcher | None = None,
    browser_mode: str = "auto",
    page_chars: int = 4000,
    *,
    goal_lines: int = 0,
    links: bool = True,
    evidence_only: bool = False,
) -> dict[str, BaseTool]:
    """``{"visit": ..., "click": ...}`` for one agent: a fresh session over the shared fetchers
    (``goal_lines``, ``links`` and ``evidence_only`` as in :class:`VisitTool`)."""
    visit = VisitTool(
        http, browser, browser_mode=browser_mode, page_chars=page_chars, session=BrowsingSession(),
        goal_lines=goal_lines, links=links, evidence_only=evidence_only,
    )
    return {"visit": visit, "click": ClickTool(visit)}
