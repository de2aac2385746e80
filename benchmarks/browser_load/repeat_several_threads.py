"""tests/test_browser.py's test_browser_from_several_threads 50 times in a row, each with a fresh browser
made as that module's fixture makes it (timeout_s=10, max_bytes=100_000), so the first fetches after a
launch are included. Run by benchmarks/browser_load/run.sh under two parallel full suites."""

from __future__ import annotations

import pytest
from test_browser import CHROMIUM
from test_browser import test_browser_from_several_threads as several_threads
from web_fixtures import RouteServer, route_server_fixture  # noqa: F401 - fixture

from mgrpo_tools import BrowserFetcher, UrlPolicy


@pytest.mark.parametrize("run", range(50))
def test_several_threads_again(run: int, route_server: RouteServer) -> None:
    policy = UrlPolicy()
    policy.allow_origin(route_server.origin)
    with BrowserFetcher(policy, executable_path=CHROMIUM, timeout_s=10, max_bytes=100_000) as browser:
        several_threads(browser, route_server)
