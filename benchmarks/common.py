"""Helpers for the benchmark scripts: timing medians, a printed table, and the JSON results file."""

from __future__ import annotations

import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mgrpo_env import strict_json

# Quick presets (CI's smoke run) write beside, not over, the full-size figures the README quotes.
RESULTS = Path(__file__).parent / "results" / ("quick" if "--quick" in sys.argv[1:] else "")


def median_ms(fn: Callable[[], Any], repeats: int) -> float:
    """Median wall time of ``fn`` in milliseconds over ``repeats`` calls (after one warm-up call)."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def rate(fn: Callable[[], Any], seconds: float = 2.0) -> float:
    """Calls per second of ``fn``, run repeatedly for about ``seconds``."""
    fn()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        fn()
        n += 1
    return n / (time.perf_counter() - t0)


def report(name: str, rows: list[tuple[str, Any, str]], extra: dict[str, Any] | None = None) -> Path:
    """Print ``rows`` (label, value, unit/comment) as a table and write them to results/<name>.json."""
    width = max(len(r[0]) for r in rows)
    print(f"\n{name}")
    for label, value, unit in rows:
        shown = f"{value:,.3f}" if isinstance(value, float) else str(value)
        print(f"  {label:<{width}}  {shown:>14}  {unit}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    payload = {
        "benchmark": name,
        "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": {"python": platform.python_version(), "cpu_count": __import__("os").cpu_count()},
        "figures": {label: {"value": value, "unit": unit} for label, value, unit in rows},
        **(extra or {}),
    }
    path.write_text(strict_json.dumps(payload, indent=2) + "\n")
    print(f"  -> {path}")
    return path
