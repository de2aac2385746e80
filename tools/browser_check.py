"""A one-shot check that Chromium really starts (for preflight checks).

The browser starts lazily on the first page that needs JavaScript, so a missing or broken Chromium
used to surface only as ``browser_error`` entries deep inside episode records while every such page
read as empty text. Callers that know their pages need JavaScript call :func:`check_browser` once,
before any work, and stop with its one-line message.

``MGRPO_CHROMIUM`` names another executable (a path, or a name looked up on ``PATH``); the default
is Debian's ``/usr/bin/chromium``.
"""

from __future__ import annotations

import time

from .chromium import INSTALL_HINT, default_chromium, find_chromium

__all__ = ["BrowserUnavailable", "INSTALL_HINT", "check_browser", "default_chromium", "find_chromium"]


class BrowserUnavailable(RuntimeError):
    """Chromium is missing or does not start; the message is one line and says how to fix it."""


def check_browser(path: str | None = None, *, timeout_s: float = 60.0) -> float:
    """Launch Chromium once (headless, through Playwright) and close it; return the seconds it took.

    Raises:
        BrowserUnavailable: the executable is missing, playwright is not installed, or the launch fails.
    """
    from .base import ToolError
    from .browser import BrowserFetcher
    from .url_policy import UrlPolicy

    path = path or default_chromium()
    if find_chromium(path) is None:
        raise BrowserUnavailable(f"Chromium not found at {path}; {INSTALL_HINT}")
    start = time.perf_counter()
    fetcher = BrowserFetcher(UrlPolicy(), executable_path=path, startup_timeout_s=timeout_s)
    try:
        fetcher.start()
    except ToolError as exc:
        message = exc.message.splitlines()[0]  # Playwright's launch errors run to dozens of lines
        raise BrowserUnavailable(message if INSTALL_HINT in message else f"{message}; {INSTALL_HINT}") from None
    finally:
        fetcher.close()
    return time.perf_counter() - start
