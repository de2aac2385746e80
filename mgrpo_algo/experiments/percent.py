"""Fractions as the reports print them: percent with one decimal, and a change with its interval in points.
One place for report.md, its attribution section and the sweep scripts' tables."""

from __future__ import annotations

import math
from collections.abc import Mapping

__all__ = ["pct", "interval_text"]


def pct(x: float | None, sign: bool = False) -> str:
    """``12.3`` (``+12.3`` with ``sign``) for the fraction 0.123; ``-`` for None or NaN (not measured)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x * 100:{'+.1f' if sign else '.1f'}}"


def interval_text(iv: Mapping[str, float] | None) -> str:
    """``+12.3 [+5.1, +19.0]`` in points, or ``-`` when the interval was not computed."""
    if not iv:
        return "-"
    return f"{pct(iv['diff'], True)} [{pct(iv['low'], True)}, {pct(iv['high'], True)}]"
