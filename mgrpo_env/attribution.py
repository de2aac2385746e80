"""Which role lost each answer: outcomes of episode records against the task's gold hops.

For a scenario that implements :class:`mgrpo_scenarios.AttributesDelegations` (wiki-hops does, from its
gold hops), each hierarchy episode gets one outcome (:data:`OUTCOMES`):

- ``right``: the answer is right;
- ``no_answer``: the main agent never answered (a turn limit, or a malformed last turn);
- ``main_combine``: wrong although every hop of the task was reported right by some sub-agent: the main
  agent failed to combine the reports;
- ``main_not_asked``: the first hop (in solving order: each chain of ``metadata["chains"]`` in turn) that no
  sub-agent reported right was never asked: the main agent delegated no hop, another relation of a
  task entity, or another entity (a chained hop asked about a wrongly reported name is the earlier
  hop's loss, which comes first);
- ``sub_wrong``: that hop was asked exactly and its sub-agents reported another answer;
- ``sub_no_result``: that hop was asked exactly and no sub-agent asked it returned a result.

And per delegation: whether it asks a needed hop exactly (``delegation/asks_hop``) or not (``delegation/
other_relation``, ``delegation/other_entity``); per exactly delegated hop, whether its report is right
(``exact_hop/right``, and per relation ``exact_hop/right/<relation>``: the sub-agents' accuracy on the
questions they were asked exactly, which a mis-delegation does not dilute).

Every figure is a ``(count, out of)`` pair per episode, pooled per question by
:func:`attribution_counts_by_question` exactly as :mod:`mgrpo_env.mistakes` pools its rates, so the same
paired bootstrap gives the change of each (mgrpo_algo's compare). Question kinds get their own outcome
rates (``outcome/<kind>/<outcome>``, out of that kind's episodes).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mgrpo_scenarios import AttributesDelegations, Task

from .mistakes import add_counts

__all__ = ["OUTCOMES", "LOST_BY", "WrongTurn", "attributable", "episode_outcome", "first_wrong_turn", "attribution_counts", "attribution_counts_by_question",
           "attribution_rates", "mean_of_question_rates", "supports_attribution", "delegation_judgements"]

#: One outcome per episode (module docstring), in the order reports list them.
OUTCOMES: tuple[str, ...] = ("right", "no_answer", "main_combine", "main_not_asked", "sub_wrong", "sub_no_result")
#: The role each lost outcome is charged to.
LOST_BY: dict[str, str] = {"main_combine": "main", "main_not_asked": "main", "sub_wrong": "sub",
                           "sub_no_result": "sub", "no_answer": "main"}


def supports_attribution(scenario: Any) -> bool:
    """Whether ``scenario`` can attribute outcomes (declares :class:`AttributesDelegations`)."""
    return isinstance(scenario, AttributesDelegations)


def _as_dict(record: Any) -> Mapping[str, Any]:
    return record if isinstance(record, Mapping) else record.to_dict()


def _field(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)


def attributable(record: Any) -> bool:
    """Whether an episode has an outcome to attribute: a hierarchy episode (not the single agent's) whose
    task has gold hops."""
    data = _as_dict(record)
    return _field(data.get("main") or {}, "role") != "single" and bool(data["task"].get("hops"))


def _solving_order(task: Task) -> list[int]:
    chains = task.metadata.get("chains") or [list(range(len(task.hops)))]
    order = [int(i) for chain in chains for i in chain]
    return order + [i for i in range(len(task.hops)) if i not in order]


def episode_outcome(record: Any, scenario: AttributesDelegations) -> tuple[str, list[tuple[int | None, str, bool | None]]]:
    """One hierarchy episode's outcome (:data:`OUTCOMES`) and, per delegation in order, ``(hop index or
    None, miss reason or "", report right: True / False / None for no result)``.

    Raises:
        ValueError: the record's task has no hops (nothing to attribute against).
    """
    outcome, delegations, _ = _outcome_and_hop(record, scenario)
    return outcome, delegations


def _outcome_and_hop(record: Any, scenario: AttributesDelegations
                     ) -> tuple[str, list[tuple[int | None, str, bool | None]], int | None]:
    """:func:`episode_outcome`, and the hop the outcome is about (the first in solving order that no
    sub-agent reported right; None for ``right``, ``no_answer`` and ``main_combine``)."""
    data = _as_dict(record)
    task = Task.from_dict(data["task"])
    if not task.hops:
        raise ValueError(f"task {task.id!r} has no gold hops: its outcome cannot be attributed")
    delegations: list[tuple[int | None, str, bool | None]] = []
    reported_right: set[int] = set()
    for sub in data.get("subs") or []:
        subtask, final = str(_field(sub, "task") or ""), _field(sub, "final")
        match = scenario.match_delegation(task, subtask)
        right = None if final is None else (match.hop is not None and scenario.hop_answered(task, match.hop, str(final)))
        delegations.append((match.hop, match.miss, right))
        if final is not None:
            reported_right.update(h for h in range(len(task.hops)) if scenario.hop_answered(task, h, str(final)))
    main_final = _field(data.get("main") or {}, "final")
    if data.get("correct"):
        return "right", delegations, None
    if main_final is None:
        return "no_answer", delegations, None
    missing = [h for h in _solving_order(task) if h not in reported_right]
    if not missing:
        return "main_combine", delegations, None
    first = missing[0]
    asked = [right for hop, _, right in delegations if hop == first]
    if not asked:
        return "main_not_asked", delegations, first
    return ("sub_wrong" if any(r is not None for r in asked) else "sub_no_result"), delegations, first


@dataclass(frozen=True)
class WrongTurn:
    """Where a hierarchy episode's answer was first lost (:func:`first_wrong_turn`): ``agent`` (its name in the
    record, e.g. ``main_0`` or ``sub_1``), ``turn`` (0-based, into that agent's turns) and ``why`` (one line)."""

    outcome: str
    agent: str
    turn: int
    why: str


def _delegating_turns(main: Mapping[str, Any], subs: Sequence[Mapping[str, Any]]) -> list[int | None]:
    """Per sub-agent (in order) the main agent's turn that started it: the delegation whose tool call names
    it, else the next successful delegation not yet claimed (records written before calls named agents)."""
    turns = main.get("turns") or []
    delegating = [i for i, t in enumerate(turns) if (t.get("tool_call") or {}).get("tool") == "delegate"
                  and (t.get("tool_call") or {}).get("ok")]
    agents = {i: ((turns[i].get("tool_call") or {}).get("meta") or {}).get("agent") for i in delegating}
    named = {agent: i for i, agent in agents.items() if agent is not None}
    out: list[int | None] = []
    for sub in subs:
        turn = named.get(sub.get("agent"))
        if turn is None:
            turn = next((i for i in delegating if i not in out and i not in named.values()), None)
        out.append(turn)
    return out


def first_wrong_turn(record: Any, scenario: AttributesDelegations) -> WrongTurn | None:
    """The first turn that went wrong in a hierarchy episode that lost its answer (None when it is right,
    for a single-agent episode or a task without hops), by the outcome of :func:`episode_outcome`:

    - ``main_not_asked``: the main agent's first delegation that asked no hop of the task; when every
      delegation asked one, its last turn (it answered without asking the missing hop);
    - ``sub_wrong``: the last turn (the report) of the first sub-agent asked the missing hop that reported
      another answer; ``sub_no_result``: the last turn of the first sub-agent asked it (it ended without a
      result);
    - ``main_combine``: the main agent's last turn (a wrong answer from right reports); ``no_answer``: its last
      turn (where it ran out of turns or broke the format).

    A sub-agent without turns is marked at the main agent's turn that delegated to it.
    """
    data = _as_dict(record)
    main = data.get("main") or {}
    if not attributable(data):
        return None
    outcome, delegations, hop = _outcome_and_hop(data, scenario)
    if outcome == "right":
        return None
    agent, last = str(main.get("agent") or "main"), max(len(main.get("turns") or []) - 1, 0)
    subs = list(data.get("subs") or [])
    starts = _delegating_turns(main, subs)
    if outcome == "no_answer":
        return WrongTurn(outcome, agent, last, f"no answer: the main agent ended without one ({data.get('end_reason') or 'no answer'})")
    if outcome == "main_combine":
        return WrongTurn(outcome, agent, last, "failed to combine: every hop was reported right, the answer is wrong")
    hops = data["task"]["hops"]
    if outcome == "main_not_asked":
        for (asked, miss, _), turn in zip(delegations, starts, strict=True):
            if asked is None and turn is not None:
                return WrongTurn(outcome, agent, turn, f"asked no hop of the task ({miss.replace('_', ' ')})")
        return WrongTurn(outcome, agent, last, f"never asked the needed hop {hop}: {hops[hop].get('question')!r}")
    want = (lambda right: right is False) if outcome == "sub_wrong" else (lambda right: right is None)
    i = next(i for i, (asked, _, right) in enumerate(delegations) if asked == hop and want(right))
    sub = subs[i]
    gold = hops[hop].get("answer")
    why = (f"reported hop {hop} wrong: {sub.get('final')!r} (gold {gold!r})" if outcome == "sub_wrong"
           else f"no result for hop {hop}: {hops[hop].get('question')!r}")
    if sub.get("turns"):
        return WrongTurn(outcome, str(sub.get("agent")), len(sub["turns"]) - 1, why)
    return WrongTurn(outcome, agent, starts[i] if starts[i] is not None else last, why)


def attribution_counts(record: Any, scenario: AttributesDelegations) -> dict[str, tuple[int, int]]:
    """One episode's ``{figure: (count, out of)}`` (module docstring); empty for a single-agent episode
    or a task without hops."""
    data = _as_dict(record)
    if not attributable(data):
        return {}
    outcome, delegations = episode_outcome(data, scenario)
    kind = data["task"].get("kind") or "unknown"
    out: dict[str, tuple[int, int]] = {}
    for name in OUTCOMES:
        out[f"outcome/{name}"] = (int(outcome == name), 1)
        out[f"outcome/{kind}/{name}"] = (int(outcome == name), 1)
    n = len(delegations)
    exact = [(hop, right) for hop, _, right in delegations if hop is not None]
    out["delegation/asks_hop"] = (len(exact), n)
    for miss in ("other_relation", "other_entity"):
        out[f"delegation/{miss}"] = (sum(m == miss for _, m, _ in delegations), n)
    out["exact_hop/right"] = (sum(right is True for _, right in exact), len(exact))
    out["exact_hop/no_result"] = (sum(right is None for _, right in exact), len(exact))
    hops = data["task"]["hops"]
    per_relation: dict[str, list[int]] = {}
    for hop, right in exact:
        add_counts(per_relation, {f"exact_hop/right/{hops[hop].get('relation') or 'unknown'}": (int(right is True), 1)})
    return {**out, **{key: (num, den) for key, (num, den) in per_relation.items()}}


def attribution_counts_by_question(records: Iterable[Any], scenario: Any) -> dict[str, dict[str, list[int]]]:
    """``{task id: {figure: [count, out of]}}`` summed over the question's samples (empty when the
    scenario cannot attribute): the input of the paired bootstrap of each figure's change."""
    if not supports_attribution(scenario):
        return {}
    out: dict[str, dict[str, list[int]]] = {}
    for record in records:
        data = _as_dict(record)
        counts = attribution_counts(data, scenario)
        if counts:
            add_counts(out.setdefault(str(data["task"].get("id")), {}), counts)
    return out


def attribution_rates(counts: Mapping[str, Mapping[str, Sequence[int]]]) -> dict[str, float | None]:
    """Every figure pooled over questions (``count / out of``; None where nothing was counted), plus
    ``delegation/asks_hop_per_question``: the share of a question's delegations that ask a needed hop,
    averaged over the questions with a delegation (the planner's figure, which a question with many
    delegations does not dominate)."""
    totals: dict[str, list[int]] = {}
    for figures in counts.values():
        add_counts(totals, figures)
    out: dict[str, float | None] = {key: (num / den if den else None) for key, (num, den) in sorted(totals.items())}
    out["delegation/asks_hop_per_question"] = mean_of_question_rates(counts, "delegation/asks_hop")
    out["episodes"] = float(totals.get("outcome/right", [0, 0])[1])
    out["delegations"] = float(totals.get("delegation/asks_hop", [0, 0])[1])
    return out


def mean_of_question_rates(counts: Mapping[str, Mapping[str, Sequence[int]]], key: str) -> float | None:
    """The mean over questions of ``count / out of`` for ``key``, over the questions where ``out of`` > 0."""
    rates = [c[key][0] / c[key][1] for c in counts.values() if key in c and c[key][1]]
    return sum(rates) / len(rates) if rates else None


def delegation_judgements(record: Any) -> list[float | None]:
    """Per turn of the main agent: 1.0 for a delegation that asks a hop the task still needs, 0.0 for one
    that does not, None for a turn that delegates nothing (the judged delegation credit's input,
    ``mgrpo_algo.core.scoring.TurnCredit.delegation``).

    Judged as the main agent could know it: a delegation asks hop h when its subtask is h's question
    (lower-cased, punctuation dropped) about h's gold entity if h starts a chain, else about a name a
    sub-agent of this episode has reported (right or wrong: the main agent cannot tell). A hop is still
    needed until a delegation that asked it came back with a result. Needs the task's gold hops (their
    ``question`` and ``entity``); a task without them gets None everywhere.
    """
    from mgrpo_scenarios.verifiers import normalize_answer as norm

    task = record.task if isinstance(record.task, Mapping) else record.task.to_dict()
    hops = task.get("hops") or []
    main = record.main
    if not hops or main is None:
        return [None] * len(getattr(main, "turns", []) or [])
    chains = task.get("metadata", {}).get("chains") or [list(range(len(hops)))]
    first = {int(chain[0]) for chain in chains if chain}
    reports = {sub.agent: sub.final for sub in record.subs}
    known = {str(hops[h]["entity"]) for h in first}  # names the question gives, then the names reported
    answered: set[int] = set()
    out: list[float | None] = []
    for turn in main.turns:
        call = turn.tool_call
        if turn.kind != "tool_call" or call is None or call.tool != "delegate":
            out.append(None)
            continue
        asked = norm(str((call.arguments or {}).get("task") or ""))
        hop = next((h for h, gold in enumerate(hops) if h not in answered and gold.get("entity")
                    and any(asked == norm(gold["question"].replace(gold["entity"], name)) for name in
                            (known if h not in first else {gold["entity"]}))), None)
        out.append(0.0 if hop is None else 1.0)
        report = reports.get((call.meta or {}).get("agent")) if call.ok else None
        if hop is not None and report is not None:
            answered.add(hop)
        if report is not None:
            known.add(str(report).strip())
    return out
