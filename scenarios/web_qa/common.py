"""What the open-web QA scenarios share: the open-web world (search backend, URL policy, response
cache), the judge, and the scenario base class over a user's downloaded files.
"""

from __future__ import annotations

import contextlib
import os
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from mgrpo_scenarios.base import Task, Verdict, require_browser
from mgrpo_tools.base import Tool

from ..tables import read_rows
from ..verifiers import AnswerVerifier, LLMJudge

VERSION = "1"
SEARXNG_ENV = "MGRPO_SEARXNG_URL"
BRAVE_ENV = "BRAVE_SEARCH_API_KEY"

# ----------------------------------------------------------------------------- world


def default_cache_path() -> Path:
    base = Path(os.environ.get("MGRPO_DATA_DIR") or Path.home() / ".cache" / "mgrpo")
    return base / "responses.sqlite"


def make_search_backend(searxng_url: str | None = None, search: str | None = None,
                        brave_api_key: str | None = None) -> Any:
    """The search backend: ``search="searxng"|"brave"`` or automatic (SearxNG when ``searxng_url`` or
    ``$MGRPO_SEARXNG_URL`` is set, else Brave when ``$BRAVE_SEARCH_API_KEY`` is set).

    Raises:
        ValueError: none configured (the message says what to set).
    """
    from mgrpo_tools.search import BraveSearchBackend, SearxngBackend

    if search not in (None, "searxng", "brave"):
        raise ValueError(f"search must be 'searxng' or 'brave', got {search!r}")
    url = searxng_url or os.environ.get(SEARXNG_ENV, "").strip()
    key = brave_api_key or os.environ.get(BRAVE_ENV, "").strip()
    if search == "searxng" or (search is None and url):
        if not url:
            raise ValueError(f"search='searxng' needs searxng_url= or ${SEARXNG_ENV}")
        return SearxngBackend(url)
    if search == "brave" or (search is None and key):
        return BraveSearchBackend(key or None)
    raise ValueError(
        "open-web benchmarks need a search backend: pass searxng_url='http://host:port' (or set "
        f"${SEARXNG_ENV}) for a SearxNG instance with JSON output enabled, or set ${BRAVE_ENV} "
        "for the Brave Search API"
    )


class OpenWebWorld:
    """The open web as a world: ``search`` (SearxNG or Brave), ``visit`` and ``click``.

    Args:
        searxng_url, search, brave_api_key: see :func:`make_search_backend`; ``backend`` overrides them.
        allow_origins: exact origins (``http://127.0.0.1:8080``) admitted although private (a local
            mirror, a test site); everything else must be a public address.
        cache_path: SQLite response cache; ``None`` -> :func:`default_cache_path`, ``False`` -> no cache.
        cache_mode: ``readwrite`` (default), ``replay``, ``record`` or ``off``.
        browser_mode: ``auto`` (Chromium for pages that need JavaScript), ``never`` or ``always``.
        page_chars: characters per page of text shown by ``visit``.
        k: search results per query.
    """

    def __init__(
        self,
        *,
        searxng_url: str | None = None,
        search: str | None = None,
        brave_api_key: str | None = None,
        backend: Any = None,
        allow_origins: Iterable[str] = (),
        cache_path: str | Path | None | bool = None,
        cache_mode: str = "readwrite",
        browser_mode: str = "auto",
        page_chars: int = 4000,
        k: int = 5,
    ) -> None:
        from mgrpo_tools.browser import BrowserFetcher
        from mgrpo_tools.cache import ResponseCache
        from mgrpo_tools.fetch import HttpFetcher
        from mgrpo_tools.search import SearchTool
        from mgrpo_tools.url_policy import UrlPolicy

        if browser_mode not in ("auto", "never", "always"):
            raise ValueError(f"browser_mode must be 'auto', 'never' or 'always', got {browser_mode!r}")
        self.browser_mode = browser_mode
        self.page_chars = page_chars
        self.cache = self.http = self.browser = self.backend = None
        self.search = None
        try:
            self.backend = backend if backend is not None else make_search_backend(searxng_url, search, brave_api_key)
            if cache_path is not False:
                path = default_cache_path() if cache_path in (None, True) else Path(cache_path)  # type: ignore[arg-type]
                self.cache = ResponseCache(path, mode=cache_mode)
            self.policy = UrlPolicy()
            for origin in allow_origins:
                self.policy.allow_origin(origin)
            self.http = HttpFetcher(self.policy, cache=self.cache)
            self.browser = BrowserFetcher(self.policy, cache=self.cache) if browser_mode != "never" else None
            self.search = SearchTool(self.backend, k=k, max_results=10, cache=self.cache)
            self.tools = self.make_tools()
        except BaseException:
            self.close()
            raise

    def make_tools(self) -> dict[str, Tool]:
        """A fresh ``{"search", "visit", "click"}`` set with its own browsing session."""
        from mgrpo_tools.visit import make_browsing_tools

        assert self.http is not None and self.search is not None
        return {"search": self.search, **make_browsing_tools(self.http, self.browser, self.browser_mode,
                                                             self.page_chars)}

    def close(self) -> None:
        """Stop the browser, fetcher, search backend and cache; safe to call twice."""
        for obj, method in ((self.browser, "close"), (self.http, "close"), (self.search, "close"),
                            (self.backend, "close"), (self.cache, "close")):
            if obj is not None and hasattr(obj, method):
                with contextlib.suppress(Exception):
                    getattr(obj, method)()
        self.browser = self.http = self.cache = self.backend = None

    def __enter__(self) -> OpenWebWorld:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_WORLD_KEYS = ("searxng_url", "search", "brave_api_key", "backend", "allow_origins", "cache_path",
               "cache_mode", "browser_mode", "page_chars", "k")


def make_judge(judge: LLMJudge | Mapping[str, Any] | None) -> LLMJudge | None:
    """``None``, an :class:`LLMJudge`, or its keyword arguments (``{"base_url": ..., "model": ...}``)."""
    if judge is None or isinstance(judge, LLMJudge):
        return judge
    if isinstance(judge, Mapping):
        missing = {"base_url", "model"} - set(judge)
        if missing:
            raise ValueError(f"judge needs {sorted(missing)}; got keys {sorted(judge)}")
        return LLMJudge(**dict(judge))
    raise TypeError(f"judge must be None, an LLMJudge or a dict of its arguments, got {type(judge).__name__}")


# ----------------------------------------------------------------------------- common base


class OpenWebScenario(ABC):
    name = ""
    default_split = ""

    def __init__(self, data: str | Path, *, judge: LLMJudge | Mapping[str, Any] | None = None,
                 limit: int | None = None, **world: Any) -> None:
        unknown = sorted(set(world) - set(_WORLD_KEYS))
        if unknown:
            raise TypeError(f"{type(self).__name__}: unknown argument(s) {unknown}")
        self.data = Path(data).expanduser()
        if not self.data.exists():
            raise FileNotFoundError(f"{self.name}: data path {str(self.data)!r} does not exist")
        self.judge = make_judge(judge)
        self.limit = limit
        self.world_options = world
        self.metadata: dict[str, Any] = {"version": VERSION, "benchmark": self.name, "data": str(self.data)}
        self._cache: dict[str, list[Task]] = {}

    def splits(self) -> list[str]:
        return [self.default_split]

    def tasks(self, split: str | None = None) -> Iterator[Task]:
        split = split or self.default_split
        if split not in self.splits():
            raise KeyError(f"{self.name}: unknown split {split!r}; valid: {self.splits()}")
        if split not in self._cache:
            self._cache[split] = list(self._load(split))
        rows = self._cache[split]
        return iter(rows if self.limit is None else rows[: self.limit])

    @abstractmethod
    def _load(self, split: str) -> Iterator[Task]:
        """The split's tasks, read from the benchmark's own files."""

    @property
    def browser_needed(self) -> str | None:
        """Open-web pages may need JavaScript: Chromium is required unless ``browser_mode`` is ``never``."""
        mode = self.world_options.get("browser_mode", "auto")
        return None if mode == "never" else f"browser_mode is {mode!r} on the open web"

    def open(self) -> OpenWebWorld:
        """The open-web world; use as ``with scenario.open() as world: ...``."""
        require_browser(self.name, self.browser_needed)
        return OpenWebWorld(**self.world_options)

    def verify(self, task: Task, prediction: str) -> Verdict:
        return AnswerVerifier(self.judge).verify(task, prediction)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(data={str(self.data)!r})"


def _read_rows(path: Path) -> list[dict[str, Any]]:
    """Rows of a ``.jsonl``, ``.json`` (a list, or {"data": [...]}), ``.csv`` or ``.parquet`` file."""
    return read_rows(path)


def _single_file(path: Path, patterns: tuple[str, ...], what: str) -> Path:
    if path.is_file():
        return path
    for pattern in patterns:
        found = sorted(p for p in path.glob(pattern) if p.is_file())
        if found:
            return found[0]
    raise FileNotFoundError(f"{what}: no {' / '.join(patterns)} file under {str(path)!r}")
