"""mgrpo_tools: the agents' web tools (search, visit, click) and their safety and caching layers.

* :mod:`.base` - the tool interface (:class:`ToolResult`, :class:`BaseTool`, :class:`ToolError`).
* :mod:`.cache` - a SQLite response cache that records and replays tool responses.
* :mod:`.url_policy` - which URLs may be fetched (schemes, hosts, no private networks).
* :mod:`.origin_map` - stable virtual origins for sites served on a loopback port.
* :mod:`.fetch` - plain HTTP fetching with the policy on every redirect hop.
* :mod:`.browser` - headless Chromium (Playwright) for pages that need JavaScript;
  :mod:`.browser_route` - the policy on each of its requests.
* :mod:`.registry` - the one name -> entry table behind every registry of the project.
* :mod:`.chromium` - where Chromium is (``MGRPO_CHROMIUM``) and how to install it.
* :mod:`.browser_check` - a one-shot launch check for preflight.
* :mod:`.html_text` - HTML to readable, paginated text with numbered links.
* :mod:`.visit` - the ``visit`` and ``click`` tools.
* :mod:`.webserver` - a loopback HTTP server for offline sites.

This package imports nothing from mgrpo_env, mgrpo_algo or mgrpo_scenarios, and never torch.
"""

# Lazy (PEP 562): importing the package, or one light submodule such as .base, loads no httpx,
# tantivy, bs4, lxml or playwright; each name is imported from its module on first use.
_EXPORTS = {
    "BaseTool": "base", "Tool": "base", "ToolError": "base", "ToolResult": "base", "optional_int": "base", "require_str": "base", "require_str_list": "base",
    "CHROMIUM_ARGS": "browser", "BrowserFetcher": "browser",
    "BrowserUnavailable": "browser_check", "check_browser": "browser_check", "find_chromium": "chromium",
    "CACHE_MODES": "cache", "ResponseCache": "cache", "request_key": "cache",
    "FetchResult": "fetch", "HttpFetcher": "fetch", "is_text_content_type": "fetch",
    "Document": "html_text", "Link": "html_text", "html_to_document": "html_text", "render_page": "html_text",
    "OriginMap": "origin_map",
    "RenderCache": "render_cache", "RenderCacheStats": "render_cache",
    "BraveSearchBackend": "search", "SearchBackend": "search", "SearchHit": "search", "SearchTool": "search", "SearxngBackend": "search", "TantivyIndex": "search", "dedup_url": "search", "host_matches": "search", "normalize_site": "search",
    "UrlPolicy": "url_policy", "normalize_url": "url_policy", "origin_of": "url_policy",
    "BROWSER_MODES": "visit", "BrowsingSession": "visit", "ClickTool": "visit", "VisitTool": "visit", "make_browsing_tools": "visit",
    "LoopbackSite": "webserver",
}


__all__ = list(_EXPORTS)


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
