"""Importing the env (or its episode records) loads no web stack: httpx, tantivy, bs4, lxml and
playwright load when a world is opened or a tool is built, not before (issue: 0.9 s per import)."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("httpx", "tantivy", "bs4", "lxml", "playwright", "torch")


@pytest.mark.parametrize("module", ["mgrpo_env", "mgrpo_env.episode", "mgrpo_scenarios", "mgrpo_tools"])
def test_importing_loads_no_web_stack(module):
    code = f"import sys, {module}; print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "", f"import {module} loaded {loaded}"


def test_tool_names_still_resolve_from_the_package():
    import mgrpo_tools

    assert mgrpo_tools.UrlPolicy.__module__ == "mgrpo_tools.url_policy"
    assert set(mgrpo_tools.__all__) <= set(dir(mgrpo_tools))
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        mgrpo_tools.Nope  # noqa: B018
