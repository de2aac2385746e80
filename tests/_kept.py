"""Fixtures' builds kept across pytest sessions of one process, for mutation runs (``make mutation``).

Under mutmut every mutant is one pytest session, forked from the process that ran the stats pass: the
built world, the tokenizer and the tiny model are kept here across sessions, so each mutant inherits
them instead of rebuilding them (about 2 s of setup per mutant, against tests that run in a fraction of
a second). pytest imports conftest.py afresh for every session, so the cache lives in this plain module
(imported once per process). The folders live outside pytest's basetemp, which keeps only the last
three sessions'. Outside mutmut each call builds its own, as before.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

_KEPT: dict[str, Any] = {}


def kept(name: str, build: Callable[[Path], Any], tmp_path_factory: Any) -> Any:
    """``build(folder)``, once per process under mutmut (the forked mutants share it), else once per call."""
    if "MUTANT_UNDER_TEST" not in os.environ:
        return build(tmp_path_factory.mktemp(name))
    if name not in _KEPT:
        folder = tempfile.mkdtemp(prefix=f"mgrpo-mutation-{name}-")
        owner = os.getpid()  # forked mutants exit with os._exit; only the process that made it removes it
        atexit.register(lambda: os.getpid() == owner and shutil.rmtree(folder, ignore_errors=True))
        _KEPT[name] = build(Path(folder))
    return _KEPT[name]
