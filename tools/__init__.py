"""mgrpo_tools: the agents' web tools (search, visit, click) and their safety and caching layers.

* :mod:`.base` - the tool interface (:class:`ToolResult`, :class:`BaseTool`, :class:`ToolError`).
* :mod:`.cache` - a SQLite response cache that records and replays tool responses.
* :mod:`.url_policy` - which URLs may be fetched (schemes, hosts, no private networks).
* :mod:`.origin_map` - stable virtual origins for sites served on a loopback port.
* :mod:`.fetch` - plain HTTP fetching with the policy on every redirect hop.
* :mod:`.browser` - headless Chromium (Playwright) for pages that need JavaScript.
* :mod:`.html_text` - HTML to readable, paginated text with numbered links.
* :mod:`.visit` - the ``visit`` and ``click`` tools.
* :mod:`.webserver` - a loopback HTTP server for offline sites.

This package imports nothing from mgrpo_env, mgrpo_algo or mgrpo_scenarios, and never torch.
"""

from .base import BaseTool, Tool, ToolError, ToolResult, optional_int, require_str, require_str_list
from .browser import CHROMIUM_ARGS, BrowserFetcher
from .cache import CACHE_MODES, ResponseCache, request_key
from .fetch import FetchResult, HttpFetcher, is_text_content_type
from .html_text import Document, Link, html_to_document, render_page
from .origin_map import OriginMap
from .search import (
    BraveSearchBackend,
    SearchBackend,
    SearchHit,
    SearchTool,
    SearxngBackend,
    TantivyIndex,
    dedup_url,
    host_matches,
    normalize_site,
)
from .url_policy import UrlPolicy, normalize_url, origin_of
from .visit import BROWSER_MODES, BrowsingSession, ClickTool, VisitTool, make_browsing_tools
from .webserver import LoopbackSite

__all__ = [
    # search
    "SearchHit",
    "SearchBackend",
    "SearchTool",
    "TantivyIndex",
    "SearxngBackend",
    "BraveSearchBackend",
    "dedup_url",
    "host_matches",
    "normalize_site",
    # base
    "BaseTool",
    "Tool",
    "ToolError",
    "ToolResult",
    "optional_int",
    "require_str",
    "require_str_list",
    # cache
    "CACHE_MODES",
    "ResponseCache",
    "request_key",
    # url policy
    "UrlPolicy",
    "OriginMap",
    "normalize_url",
    "origin_of",
    # fetching
    "FetchResult",
    "HttpFetcher",
    "is_text_content_type",
    "BrowserFetcher",
    "CHROMIUM_ARGS",
    # page text
    "Document",
    "Link",
    "html_to_document",
    "render_page",
    # visit / click
    "BROWSER_MODES",
    "BrowsingSession",
    "VisitTool",
    "ClickTool",
    "make_browsing_tools",
    # loopback web server
    "LoopbackSite",
    # search: names from .search go here
]
