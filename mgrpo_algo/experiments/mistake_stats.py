"""Held-out decision-mistake statistics of a comparison: pooled rates and their changes with intervals.

The per-question counts come from :func:`mgrpo_env.mistakes.counts_by_question`; the intervals from
:func:`mgrpo_algo.experiments.intervals.paired_ratio_difference`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mgrpo_env.mistakes import ENDING_RATE_KEYS, MISTAKE_RATE_KEYS, add_counts

from . import intervals as iv

__all__ = ["mistake_changes", "pool_counts"]


def mistake_changes(after: Mapping[str, Mapping[str, Sequence[int]]], before: Mapping[str, Mapping[str, Sequence[int]]],
                    *, seed: int) -> dict[str, Any]:
    """Each mistake rate's change after - before (:data:`mgrpo_env.mistakes.MISTAKE_RATE_KEYS`, and how
    episodes end: ``ENDING_RATE_KEYS``), with its paired bootstrap interval over questions; None for a
    rate neither side can have."""
    def of(counts: Mapping[str, Mapping[str, Sequence[int]]], kind: str) -> dict[str, Sequence[int]]:
        return {q: c[kind] for q, c in counts.items() if kind in c}

    return {kind: iv.paired_ratio_difference(of(after, kind), of(before, kind), seed=seed) for kind in (*MISTAKE_RATE_KEYS, *ENDING_RATE_KEYS)}


def pool_counts(runs: Sequence[Mapping[str, Mapping[str, Sequence[int]]]]) -> dict[str, dict[str, list[int]]]:
    """Several seeds' per-question mistake counts as one (summed per question and rate)."""
    out: dict[str, dict[str, list[int]]] = {}
    for run in runs:
        for q, kinds in run.items():
            add_counts(out.setdefault(q, {}), kinds)
    return out
