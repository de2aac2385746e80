"""Tool backend failures in episode records: counted per kind, so that a degraded run says so.

A tool call can fail because the agent asked for something wrong (bad arguments, a refused URL, a
404): that is the agent's business and part of the task. A *backend* failure is the machinery's:
the browser could not render a JavaScript page (``meta["browser_error"]``: the agent read the bare,
often empty, page instead), or a tool's backend is down (an error of kind ``backend``, e.g. the
search server). Those lower every result without any agent being worse, so every summary prints
their counts (:func:`backend_failure_line`) and runs with any say so first.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["call_failure", "backend_failures", "backend_failures_in_files", "backend_failure_line"]


def call_failure(tool: str, ok: bool, error: str | None, meta: Mapping[str, Any]) -> str | None:
    """The backend failure kind of one tool call (``"browser backend"``, ``"search backend"``), or None."""
    browser = meta.get("browser_error")
    if browser:
        return f"browser {str(browser).partition(':')[0].strip() or 'error'}"
    if not ok and error and error.startswith("backend:"):
        return f"{tool} backend"
    return None


def _calls(record: Any) -> Iterable[tuple[str, bool, str | None, Mapping[str, Any]]]:
    """(tool, ok, error, meta) of every call in a record (an EpisodeRecord or its JSON dict)."""
    if isinstance(record, Mapping):
        trajectories = [record.get("main") or {}, *(record.get("subs") or [])]
        for traj in trajectories:
            for turn in traj.get("turns") or []:
                call = turn.get("tool_call")
                if call:
                    yield call.get("tool", "?"), bool(call.get("ok", True)), call.get("error"), call.get("meta") or {}
        return
    for traj in [record.main, *record.subs]:
        if traj is None:
            continue
        for call in traj.tool_calls:
            yield call.tool, call.ok, call.error, call.meta


def backend_failures(records: Iterable[Any]) -> dict[str, int]:
    """Backend failures per kind over ``records`` (EpisodeRecords or their JSON dicts)."""
    counts: Counter[str] = Counter()
    for record in records:
        for call in _calls(record):
            kind = call_failure(*call)
            if kind is not None:
                counts[kind] += 1
    return dict(sorted(counts.items()))


def backend_failures_in_files(paths: Iterable[str | Path]) -> dict[str, int]:
    """:func:`backend_failures` over JSONL files of records, read line by line (missing files: none)."""
    total: Counter[str] = Counter()
    for path in paths:
        path = Path(path)
        if not path.is_file():
            continue
        with path.open() as fh:
            total.update(backend_failures(json.loads(line) for line in fh if line.strip()))
    return dict(sorted(total.items()))


def backend_failure_line(counts: Mapping[str, int]) -> str:
    """One line for a summary: ``"tool backend failures: none"`` or a warning naming each kind."""
    if not counts:
        return "tool backend failures: none"
    parts = ", ".join(f"{kind} {n}" for kind, n in counts.items())
    return (f"WARNING: tool backend failures: {parts} (the tools did not work as they should: "
            "results are lower than a working setup gives)")
