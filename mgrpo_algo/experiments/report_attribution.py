"""report.md's "Which role lost each answer" section and its checks (summary ``attribution``, from
:mod:`mgrpo_algo.experiments.attribution_stats`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .percent import interval_text as _ci
from .percent import pct as _pct

__all__ = ["OUTCOME_NAMES", "attribution_section", "attribution_checks", "DELEGATION_TARGET"]

#: The words the report uses for each outcome (mgrpo_env.attribution.OUTCOMES).
OUTCOME_NAMES = {
    "right": "right",
    "no_answer": "no answer (main)",
    "main_combine": "wrong although every hop was reported right (main failed to combine)",
    "main_not_asked": "a needed hop never asked (main)",
    "sub_wrong": "a needed hop asked, reported wrong (sub-agent)",
    "sub_no_result": "a needed hop asked, no result (sub-agent)",
}
#: The share of delegations asking a needed hop (per question, averaged) M-GRPO's planner should reach.
DELEGATION_TARGET = 0.80


def attribution_checks(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The planner's checks: under M-GRPO, the delegations that ask a needed hop (per question) rise
    (interval above 0) to at least :data:`DELEGATION_TARGET`, and the aggregation questions answered right
    rise (interval above 0). None of them without attribution figures for M-GRPO."""
    m = (summary.get("attribution") or {}).get("mgrpo")
    if not m:
        return []
    key = "delegation/asks_hop_per_question"
    change, after = m["change"].get(key), m["after"].get(key)
    checks = [{"check": f"under M-GRPO, held-out delegations that ask a needed hop (per question) rise (interval above 0) "
                        f"to >= {DELEGATION_TARGET * 100:.0f}%",
               "passed": None if not change or after is None else bool(change["low"] > 0 and after >= DELEGATION_TARGET),
               "figures": f"{_pct(m['start'].get(key))} -> {_pct(after)}%, change {_ci(change)} points"}]
    agg = m["change"].get("outcome/aggregation/right")
    checks.append({"check": "under M-GRPO, held-out aggregation questions answered right rise (interval above 0)",
                   "passed": None if not agg else bool(agg["low"] > 0),
                   "figures": "no aggregation question" if not agg else
                   f"{_pct(m['start'].get('outcome/aggregation/right'))} -> {_pct(m['after'].get('outcome/aggregation/right'))}%, "
                   f"change {_ci(agg)} points"})
    return checks


def _kinds(rates: Mapping[str, float | None]) -> list[str]:
    return sorted({k.split("/")[1] for k in rates if k.startswith("outcome/") and k.count("/") == 2})


def attribution_section(summary: Mapping[str, Any]) -> list[str]:
    """Per mode start -> after (and the reference start beside): the outcome of every held-out episode,
    per question kind, the delegations, and the sub-agents' accuracy on exactly delegated hops per relation."""
    attribution = summary.get("attribution") or {}
    if not attribution:
        return []
    reference = (summary.get("reference") or {}).get("attribution")
    ref_name = (summary.get("reference") or {}).get("name", "reference")
    rows = []
    figures = [(f"outcome/{o}", name) for o, name in OUTCOME_NAMES.items()] + [
        ("delegation/asks_hop_per_question", "delegations that ask a needed hop (per question, averaged)"),
        ("delegation/asks_hop", "delegations that ask a needed hop (pooled)"),
        ("delegation/other_relation", "delegations: a task entity, another relation"),
        ("delegation/other_entity", "delegations: another entity"),
        ("exact_hop/right", "sub-agents right on exactly delegated hops"),
        ("exact_hop/no_result", "exactly delegated hops without a result"),
    ]
    for mode, m in attribution.items():
        for key, name in figures:
            rows.append(f"| {mode} | {name} | {_pct(m['start'].get(key))} | {_pct(m['after'].get(key))} | "
                        f"{_ci(m['change'].get(key))} | {_pct((reference or {}).get(key))} |")
    kind_rows = []
    for mode, m in attribution.items():
        for kind in _kinds(m["after"]):
            cells = [f"{_pct(m['start'].get(f'outcome/{kind}/{o}'))} -> {_pct(m['after'].get(f'outcome/{kind}/{o}'))}"
                     for o in OUTCOME_NAMES]
            kind_rows.append(f"| {mode} | {kind} | " + " | ".join(cells) + " |")
    relations = sorted({k.rsplit("/", 1)[1] for m in attribution.values() for k in m["after"]
                        if k.startswith("exact_hop/right/")})
    relation_rows = [f"| {mode} | " + " | ".join(
        f"{_pct(m['start'].get(f'exact_hop/right/{r}'))} -> {_pct(m['after'].get(f'exact_hop/right/{r}'))}" for r in relations)
        + " |" for mode, m in attribution.items()]
    return [
        "## Which role lost each answer (held-out)", "",
        "Every held-out episode has one outcome (`mgrpo_env.attribution`, from the task's gold hops): right; no "
        "answer; wrong although a sub-agent reported every hop right (the main agent failed to combine); else "
        "the first hop no sub-agent reported right was never asked exactly (the main agent asked another "
        "relation, another entity, or nothing), or was asked and reported wrong / without a result (a "
        "sub-agent). A delegation asks a needed hop when its subtask is one of the task's hop questions "
        "(lower-cased, punctuation dropped); the sub-agents' accuracy counts only those, so a mis-delegation "
        "does not dilute it (it replaces the sweeps' old 'hop skill', the mean expert score of every "
        f"delegation). Percent, pooled over seeds; change = after - start with a paired bootstrap interval "
        f"over questions; `{ref_name}` is the reference start.", "",
        f"| mode | figure | start | after | change [95% CI] | {ref_name} |", "|---|---|---:|---:|---|---:|", *rows, "",
        "Per question kind, start -> after (percent of that kind's episodes):", "",
        "| mode | kind | " + " | ".join(OUTCOME_NAMES[o].split(" (")[0] for o in OUTCOME_NAMES) + " |",
        "|---|---|" + "---|" * len(OUTCOME_NAMES), *kind_rows, "",
        "Sub-agents right on exactly delegated hops, per relation, start -> after (percent):", "",
        "| mode | " + " | ".join(relations) + " |", "|---|" + "---|" * len(relations), *relation_rows, "",
    ]
