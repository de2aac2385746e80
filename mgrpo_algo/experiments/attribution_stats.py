"""Which role lost each held-out answer, per mode: start -> after with paired intervals.

The per-question counts come from :func:`mgrpo_env.attribution.attribution_counts_by_question` (merged
into the evaluation's per-question mistake counts, so seeds pool the same way); the changes from
:mod:`mgrpo_algo.experiments.intervals`. A scenario without the attribution hook has none of these
figures, and the summary then has no ``attribution`` section.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mgrpo_env.attribution import OUTCOMES, attribution_rates

from . import intervals as iv

__all__ = ["ATTRIBUTION_CHANGE_KEYS", "attribution_changes", "attribution_summary", "has_attribution"]

#: The figures whose change gets a paired interval (pooled rates, but for the per-question delegation share).
ATTRIBUTION_CHANGE_KEYS: tuple[str, ...] = (
    *(f"outcome/{o}" for o in OUTCOMES), "outcome/aggregation/right", "delegation/asks_hop",
    "delegation/asks_hop_per_question", "exact_hop/right",
)


def has_attribution(counts: Mapping[str, Mapping[str, Sequence[int]]]) -> bool:
    """Whether per-question counts carry attribution figures."""
    return any("outcome/right" in c for c in counts.values())


def _of(counts: Mapping[str, Mapping[str, Sequence[int]]], key: str) -> dict[str, Sequence[int]]:
    return {q: c[key] for q, c in counts.items() if key in c}


def attribution_changes(after: Mapping[str, Mapping[str, Sequence[int]]], before: Mapping[str, Mapping[str, Sequence[int]]],
                        *, seed: int) -> dict[str, Any]:
    """Each figure of :data:`ATTRIBUTION_CHANGE_KEYS`, after - before, with its paired bootstrap interval
    over questions (fractions); None where either side counted nothing."""
    out: dict[str, Any] = {}
    for key in ATTRIBUTION_CHANGE_KEYS:
        if key == "delegation/asks_hop_per_question":
            out[key] = iv.paired_mean_ratio_difference(_of(after, "delegation/asks_hop"), _of(before, "delegation/asks_hop"),
                                                       seed=seed)
        else:
            out[key] = iv.paired_ratio_difference(_of(after, key), _of(before, key), seed=seed)
    return out


def attribution_summary(start: Mapping[str, Mapping[str, Sequence[int]]], after: Mapping[str, Mapping[str, Sequence[int]]],
                        *, seed: int) -> dict[str, Any] | None:
    """One mode's ``{"start": rates, "after": rates, "change": intervals}`` (None without attribution)."""
    if not (has_attribution(start) or has_attribution(after)):
        return None
    return {"start": attribution_rates(start), "after": attribution_rates(after),
            "change": attribution_changes(after, start, seed=seed)}
