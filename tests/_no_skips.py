"""``make test`` and CI fail on a skip that is not about a missing GPU (issue 32, item 6): a skipped test
that needs Redis, Chromium or a library hides work; install the part instead.

Active when ``MGRPO_NO_SKIPS=1`` (the Makefile's test targets set it); a plain ``pytest`` run keeps its
skips as skips."""

from __future__ import annotations

import os
import re

#: Skip reasons that are expected on a machine without the device (the GPU tests skip themselves there).
ALLOWED = re.compile(r"\b(gpu|cuda|device)\b", re.IGNORECASE)


def unexpected_skips(skips: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The ``(test id, reason)`` skips whose reason is not an allowed one."""
    return [(node, reason) for node, reason in skips if not ALLOWED.search(reason)]


class NoSkips:
    """A pytest plugin: collects skips, then fails the session on unexpected ones with a line each."""

    def __init__(self) -> None:
        self.skips: list[tuple[str, str]] = []

    def pytest_runtest_logreport(self, report) -> None:
        if report.skipped and not hasattr(report, "wasxfail"):
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            self.skips.append((report.nodeid, reason))

    def pytest_sessionfinish(self, session, exitstatus) -> None:
        bad = unexpected_skips(self.skips)
        if bad:
            for node, reason in bad:
                print(f"\nunexpected skip (MGRPO_NO_SKIPS=1): {node}: {reason}")
            session.exitstatus = 1


def register(config) -> None:
    if os.environ.get("MGRPO_NO_SKIPS") == "1":
        config.pluginmanager.register(NoSkips(), "mgrpo-no-skips")
