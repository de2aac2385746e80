"""Decision-mistake rates of episode records: what RL is meant to remove, measured on any episodes.

The rates match the imperfect teacher's mistake kinds (:mod:`mgrpo_env.teacher`), so the same
numbers describe a teacher's demonstrations, a start model's evaluation, each training iteration's
rollouts and the evaluation after RL (compare's report.md and its detail figures show them per mode).

Hierarchy records (a main agent and its sub-agents):

- ``answer_early``: the share of the main agent's decision points *with hops left* (delegations made
  < the hops the question needs, capped at the episode's delegation limit) at which it answered
  instead of delegating: the per-decision hazard the teacher's ``answer_early`` rate sets;
- ``answer_early_episodes``: the share of episodes that answered with hops left;
- ``report_without_visit``: the share of sub-agent reports (sub-agents that returned a result) made
  without any ``visit`` in the sub-agent's trajectory;
- ``delegations``: delegations per episode.

Single-agent records: a hop starts with a search for a new name. ``answer_early_episodes`` counts an
answer given after fewer hops than the question has; ``report_without_visit`` is the share of hops the
agent left (for the next hop or the answer) without visiting a page; the per-decision rate is None.

A visit of the wrong search hit (the teacher's ``visit_wrong_hit``) is not counted: telling it from
a right visit needs the world, which episode records do not hold.

How episodes end (:data:`ENDING_RATE_KEYS`; format decay, not decisions, and counted the same way):

- ``malformed_main_episodes``: the share of episodes with at least one malformed main (or single) turn;
- ``malformed_main_turns`` / ``malformed_sub_turns``: the share of that role's turns that were malformed;
- ``sub_no_result``: the share of sub-agents that ended without a result (a turn limit);
- ``turn_limit_episodes``: the share of episodes that ended at the main (or single) agent's turn limit,
  never answering;
- ``answered_accuracy``: the share of answered episodes that were right (an accuracy, not a mistake).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["mistake_rates", "record_counts", "counts_by_question", "rates_of_counts", "add_counts", "MISTAKE_RATE_KEYS",
           "ENDING_RATE_KEYS"]

#: The keys of :func:`mistake_rates` that are rates of a mistake (what report.md tabulates).
MISTAKE_RATE_KEYS: tuple[str, ...] = ("answer_early", "answer_early_episodes", "report_without_visit")
#: The keys of :func:`mistake_rates` that say how episodes end (the module docstring), counted alike.
ENDING_RATE_KEYS: tuple[str, ...] = ("malformed_main_episodes", "malformed_main_turns", "malformed_sub_turns",
                                     "sub_no_result", "turn_limit_episodes", "answered_accuracy")


def _as_dict(record: Any) -> Mapping[str, Any]:
    return record if isinstance(record, Mapping) else record.to_dict() if hasattr(record, "to_dict") else vars(record)


def _tool(turn: Mapping[str, Any]) -> str | None:
    call = turn.get("tool_call") or {}
    return call.get("tool") if isinstance(call, Mapping) else getattr(call, "tool", None)


def _turns(trajectory: Any) -> list[Mapping[str, Any]]:
    if trajectory is None:
        return []
    turns = trajectory.get("turns", []) if isinstance(trajectory, Mapping) else trajectory.turns
    return [t if isinstance(t, Mapping) else {"kind": t.kind, "tool_call": t.tool_call and vars(t.tool_call)} for t in turns]


def _single_hops(turns: list[Mapping[str, Any]]) -> list[bool]:
    """The hops a single agent worked on, in order, each with whether it visited a page for it: a hop
    starts with a search for a new entity (a quoted retry of the same name is the same hop)."""
    hops: list[bool] = []
    current = None
    for turn in turns:
        tool = _tool(turn)
        if tool == "search":
            queries = ((turn.get("tool_call") or {}).get("arguments") or {}).get("queries") or [""]
            name = str(queries[0]).strip().strip('"')
            if name != current:
                hops.append(False)
                current = name
        elif tool == "visit" and hops:
            hops[-1] = True
    return hops


def _role(trajectory: Any) -> str | None:
    if not trajectory:
        return None
    return trajectory.get("role") if isinstance(trajectory, Mapping) else getattr(trajectory, "role", None)


def _final(trajectory: Any) -> Any:
    return trajectory.get("final") if isinstance(trajectory, Mapping) else trajectory.final


def ending_counts(data: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    """One episode's (count, out of) for each rate of :data:`ENDING_RATE_KEYS`."""
    main_turns = _turns(data.get("main"))
    subs = data.get("subs") or []
    sub_turns = [t for sub in subs for t in _turns(sub)]
    main_errors = sum(t["kind"] == "error" for t in main_turns)
    answered = any(t["kind"] == "answer" for t in main_turns)
    out = {"malformed_main_episodes": (int(main_errors > 0), 1),
           "malformed_main_turns": (main_errors, len(main_turns)),
           "turn_limit_episodes": (int(str(data.get("end_reason", "")).endswith("turn_limit")), 1),
           "answered_accuracy": (int(answered and bool(data.get("correct"))), int(answered))}
    if _role(data.get("main")) != "single":
        out["malformed_sub_turns"] = (sum(t["kind"] == "error" for t in sub_turns), len(sub_turns))
        out["sub_no_result"] = (sum(_final(sub) is None for sub in subs), len(subs))
    return out


def record_counts(record: Any, max_delegations: int = 3) -> dict[str, tuple[int, int]]:
    """One episode's (mistakes, decisions) per rate of :func:`mistake_rates`, its delegations and how it
    ended (:func:`ending_counts`)."""
    data = _as_dict(record)
    return {**_decision_counts(data, max_delegations), **ending_counts(data)}


def _decision_counts(data: Mapping[str, Any], max_delegations: int) -> dict[str, tuple[int, int]]:
    hops = len(data["task"].get("hops") or [])
    main = data.get("main")
    turns = _turns(main)
    role = _role(main)
    answered = any(t["kind"] == "answer" for t in turns)
    if role == "single":
        hops_read = _single_hops(turns)
        closed = hops_read if answered else hops_read[:-1]  # a hop left for the next one, or for the answer
        return {"answer_early_episodes": (int(answered and len(hops_read) < hops), 1),
                "report_without_visit": (sum(not visited for visited in closed), len(closed))}
    need = min(hops, max_delegations)
    made = decisions = early = 0
    for turn in turns:
        if _tool(turn) == "delegate":
            decisions += made < need
            made += 1
        elif turn["kind"] == "answer" and made < need:
            decisions += 1
            early += 1
    reports = unvisited = 0
    for sub in data.get("subs", []):
        if _final(sub) is None:
            continue
        reports += 1
        unvisited += all(_tool(t) != "visit" for t in _turns(sub))
    return {"answer_early": (early, decisions), "answer_early_episodes": (int(answered and made < need), 1),
            "report_without_visit": (unvisited, reports), "delegations": (made, 1)}


def add_counts(into: dict[str, list[int]], counts: Mapping[str, Sequence[int]]) -> dict[str, list[int]]:
    """Add ``{rate: (mistakes, decisions)}`` into ``into`` (in place) and return it."""
    for key, (num, den) in counts.items():
        pair = into.setdefault(key, [0, 0])
        pair[0] += num
        pair[1] += den
    return into


def counts_by_question(records: Iterable[Any], max_delegations: int = 3) -> dict[str, dict[str, list[int]]]:
    """``{task id: {rate: [mistakes, decisions]}}`` summed over the question's samples: the input of
    the paired bootstrap of a rate's change (:func:`mgrpo_algo.experiments.intervals.paired_ratio_difference`)."""
    out: dict[str, dict[str, list[int]]] = {}
    for record in records:
        data = _as_dict(record)
        add_counts(out.setdefault(str(data["task"].get("id")), {}), record_counts(data, max_delegations))
    return out


def rates_of_counts(counts: Mapping[str, Mapping[str, Sequence[int]]]) -> dict[str, float | None]:
    """The rates of :func:`mistake_rates` from per-question counts (:func:`counts_by_question`, possibly
    pooled over runs): each rate pooled over every question."""
    totals: dict[str, list[int]] = {}
    for kinds in counts.values():
        add_counts(totals, kinds)
    out: dict[str, float | None] = {key: (num / den if den else None)
                                    for key, (num, den) in ((k, totals.get(k, (0, 0)))
                                                            for k in (*MISTAKE_RATE_KEYS, "delegations", *ENDING_RATE_KEYS))}
    out["episodes"] = float(totals.get("answer_early_episodes", [0, 0])[1])
    out["main_decisions"] = float(totals.get("answer_early", [0, 0])[1])
    out["sub_reports"] = float(totals.get("report_without_visit", [0, 0])[1])
    return out


def mistake_rates(records: Iterable[Any], max_delegations: int = 3) -> dict[str, float | None]:
    """The mistake rates (module docstring) of ``records``: :class:`~mgrpo_env.episode.EpisodeRecord`
    objects or their dicts, hierarchy or single-agent. A rate with nothing to count is None.

    >>> ep = {"task": {"hops": [{}, {}]}, "main": {"turns": [
    ...     {"kind": "tool_call", "tool_call": {"tool": "delegate"}}, {"kind": "answer"}]},
    ...     "subs": [{"final": "x", "turns": [{"kind": "tool_call", "tool_call": {"tool": "search"}},
    ...                                       {"kind": "result"}]}]}
    >>> r = mistake_rates([ep])
    >>> r["answer_early"], r["answer_early_episodes"], r["report_without_visit"], r["delegations"]
    (0.5, 1.0, 1.0, 1.0)
    """
    return rates_of_counts(counts_by_question(records, max_delegations))
