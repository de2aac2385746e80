"""What the AEC env and the single-agent env share: limits, reward settings, the world, tool calls.

The env never imports torch; this module talks to scenarios and tools only.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import mgrpo_scenarios
from mgrpo_scenarios import AnswersSubtasks, Scenario, Task
from mgrpo_scenarios.verifiers import normalize_answer, token_f1

from .episode import ToolCall
from .protocol import TOOL_FACTORIES, ParsedAction
from .rewards import PAPER_MAIN_WEIGHTS, PAPER_SUB_WEIGHTS

__all__ = [
    "Limits",
    "RewardConfig",
    "WorldHandle",
    "hop_expert_score",
    "expert_scorer",
    "subtask_expert_score",
    "ExpertScore",
    "SUBTASK_FELL_BACK",
    "EXPERT_REFERENCES",
    "call_tool",
    "resolve_scenario",
    "split_tasks",
    "pick_task",
    "safe_verify",
]


@dataclass(frozen=True)
class Limits:
    """Episode limits. Hitting one truncates cleanly: the agent is stopped, the episode goes on or ends.

    Attributes:
        max_main_turns: actions of the main agent (each delegation is one); then the episode is truncated.
            The defaults here are the project's only turn-limit defaults (train configs and the
            single-agent env take this object).
        max_sub_turns: actions of one sub-agent; then it stops and the main agent is told.
        max_delegations: sub-agents per episode (agents ``sub_0 .. sub_{N-1}``).
        max_action_chars: longer actions are a format failure ("too_long").
        max_observation_chars: longer observations are cut with a note.
    """

    max_main_turns: int = 8
    max_sub_turns: int = 6
    max_delegations: int = 4
    max_action_chars: int = 4000
    max_observation_chars: int = 6000

    @property
    def single_agent_turns(self) -> int:
        """The single agent's action budget: the hierarchy's main turns times sub turns (each main
        turn may delegate a whole sub-agent), so the baseline is not starved of tool calls."""
        return self.max_main_turns * self.max_sub_turns

    def __post_init__(self) -> None:
        for name in ("max_main_turns", "max_sub_turns", "max_action_chars", "max_observation_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"Limits.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_delegations < 0:
            raise ValueError(f"Limits.max_delegations must be >= 0, got {self.max_delegations}")
        if self.max_observation_chars < 200:
            raise ValueError("Limits.max_observation_chars must be >= 200 (room for an error message)")


# (task, delegated subtask text, sub-agent's result) -> score in [0, 1], or None when it cannot judge
ExpertScorer = Callable[[Task, str, str], "float | None"]


def hop_expert_score(task: Task, subtask: str, result: str) -> float | None:
    """r_expert from the scenario's per-hop gold answers.

    The hops whose entity the subtask names are the candidates (all hops when it names none); the
    score is the best over candidates of 1.0 when the hop's gold answer appears in the result
    (normalised), else the token F1 between result and gold. None when the task has no hops.
    """
    if not task.hops:
        return None
    norm_task = normalize_answer(subtask)
    candidates = [h for h in task.hops if h.entity and normalize_answer(h.entity) in norm_task] or list(task.hops)
    norm_result = f" {normalize_answer(result)} "
    best = 0.0
    for hop in candidates:
        gold = normalize_answer(hop.answer)
        if gold and f" {gold} " in norm_result:
            return 1.0
        best = max(best, token_f1(result, hop.answer))
    return best


hop_expert_score.source = "hops"  # type: ignore[attr-defined]


class ExpertScore(float):
    """An r_expert value that names where it came from, when that is not the scorer's own ``source``
    (a ``subtask`` score that fell back to the hop's): the env's ``expert_source`` reads it."""

    source: str

    def __new__(cls, value: float, source: str) -> ExpertScore:
        score = super().__new__(cls, value)
        score.source = source
        return score

    def __reduce__(self) -> tuple[Any, ...]:  # float's own would drop the source (and __new__ needs it)
        return (ExpertScore, (float(self), self.source))


#: ``expert_source`` of a report that ``expert_reference: subtask`` scored against the hop, because the
#: scenario could not answer the subtask it was given (no hop of the question, an unknown entity).
SUBTASK_FELL_BACK = "subtask>hops"


def subtask_expert_score(scenario: Any) -> ExpertScorer:
    """r_expert against the subtask as the main agent delegated it (``expert_reference: subtask``).

    The paper's score (:func:`hop_expert_score`) compares a report with the gold answer of the
    question's hop, so a sub-agent that answers a mis-delegated subtask correctly ("the founder of Y"
    where the hop is about X, because an earlier report named Y) scores 0 and is blamed for the main
    agent's mistake. Here the reference is the scenario's answer to the subtask itself
    (``scenario.subtask_answer(task, subtask)``); where the scenario cannot answer that subtask (one
    that is no hop of the question, an entity the world does not hold) the hop's score is paid and
    says so (``expert_source`` :data:`SUBTASK_FELL_BACK`).

    Raises:
        TypeError: ``scenario`` cannot answer subtasks at all (no ``subtask_answer``): scoring every
            report against the hop in silence would be ``hop`` under another name.
    """
    if not isinstance(scenario, AnswersSubtasks):  # no silent default
        raise TypeError(f"expert_reference 'subtask' needs a scenario that answers subtasks (subtask_answer); "
                        f"{getattr(scenario, 'name', type(scenario).__name__)!r} has none: use 'hop'")

    def score(task: Task, subtask: str, result: str) -> float | None:
        gold = scenario.subtask_answer(task, subtask)
        if gold is None:
            by_hop = hop_expert_score(task, subtask, result)
            return None if by_hop is None else ExpertScore(by_hop, SUBTASK_FELL_BACK)
        norm_gold = normalize_answer(gold)
        if norm_gold and f" {norm_gold} " in f" {normalize_answer(result)} ":
            return 1.0
        return token_f1(result, gold)

    score.source = "subtask"  # type: ignore[attr-defined]
    return score


#: ``RewardConfig.expert_reference`` values: what a sub-agent's report is scored against.
EXPERT_REFERENCES = ("hop", "subtask")


def expert_scorer(judge: Any | None = None, *, reference: str = "hop", scenario: Any = None) -> ExpertScorer:
    """r_expert: from the scenario's per-hop gold answers when the task has hops, else from ``judge``
    (an ``LLMJudge``: ``score_subtask(subtask, gold, report)`` with the task's final answer as the
    reference), else None - the caller then drops the expert term (b3 = 0) and says so.

    A judge that fails (network, bad reply after retries) gives None for that sub-agent, not a crash.
    """

    if reference not in EXPERT_REFERENCES:
        raise ValueError(f"expert reference must be one of {EXPERT_REFERENCES}, got {reference!r}")
    by_gold = subtask_expert_score(scenario) if reference == "subtask" else hop_expert_score

    def score(task: Task, subtask: str, result: str) -> float | None:
        from_hops = by_gold(task, subtask, result)
        if from_hops is not None or judge is None:
            return from_hops
        try:
            return float(judge.score_subtask(subtask, task.answer, result))
        except Exception:  # noqa: BLE001 - a judge outage must not end the episode
            return None

    name = "hops" if reference == "hop" else "subtask"
    score.source = f"{name}+judge" if judge is not None else name  # type: ignore[attr-defined]
    return score


@dataclass(frozen=True)
class RewardConfig:
    """Reward weights (docs/design.md; the paper's values by default) and the expert scorer.

    Attributes:
        main_weights: (a1, a2) for R_M = a1*r_format + a2*r_correct. Paper: (0.1, 0.9).
        sub_weights: (b1, b2, b3) for R_S = b1*r_format + b2*r_correct^main + b3*r_expert.
            Paper: (0.1, 0.4, 0.5); "the 0.4/0.5 balance is crucial".
        expert: scorer for r_expert; default uses the scenario's per-hop gold answers (see
            :func:`expert_scorer` to add an LLM judge). When it returns None (no hops, no judge)
            b3 is set to 0 for that sub-agent and ``infos`` say so (``expert_source: "none"``).
        sub_format_gate: pay b1 in proportion to r_expert (:func:`~mgrpo_env.rewards.paid_sub_reward`);
            False is the paper.
        terms: each role's extra reward terms, role -> ((name, weight), ...) of
            :data:`~mgrpo_env.rewards.REWARD_TERMS`; none is the paper.
        called: a registered called role's own (weights, format gate) for its ``RoleSpec.reward``, role ->
            pair; a called role not named (the sub-agents) is paid with ``sub_weights`` and ``sub_format_gate``.
    """

    main_weights: tuple[float, float] = PAPER_MAIN_WEIGHTS
    sub_weights: tuple[float, float, float] = PAPER_SUB_WEIGHTS
    expert: ExpertScorer | None = hop_expert_score
    sub_format_gate: bool = False
    terms: Mapping[str, tuple[tuple[str, float], ...]] = field(default_factory=dict)
    called: Mapping[str, tuple[tuple[float, ...], bool]] = field(default_factory=dict)

    def called_weights(self, role: str) -> tuple[tuple[float, ...], bool]:
        """(weights, format gate) the called ``role``'s reward is paid with (:attr:`called`, else the sub-agents')."""
        return self.called.get(role, (self.sub_weights, self.sub_format_gate))


def resolve_scenario(scenario: str | Scenario, scenario_kwargs: Mapping[str, Any] | None) -> Scenario:
    if isinstance(scenario, str):
        return mgrpo_scenarios.get(scenario, **dict(scenario_kwargs or {}))
    if scenario_kwargs:
        raise ValueError("scenario_kwargs only apply when the scenario is given by name")
    return scenario


def split_tasks(scenario: Scenario, split: str, tasks: Sequence[Task] | None) -> list[Task]:
    out = list(tasks) if tasks is not None else list(scenario.tasks(split))
    if not out:
        raise ValueError(f"no tasks in split {split!r} of scenario {getattr(scenario, 'name', scenario)!r}")
    return out


def pick_task(tasks: Sequence[Task], np_random: Any, options: Mapping[str, Any], split: str) -> Task:
    """The task of a new episode: ``options["task"]`` (a Task), ``options["task_id"]``, or one drawn
    with the env's ``np_random`` (so the episode follows ``reset(seed=)``)."""
    if isinstance(options.get("task"), Task):
        return options["task"]
    if "task_id" in options:
        for task in tasks:
            if task.id == options["task_id"]:
                return task
        raise ValueError(f"no task with id {options['task_id']!r} in split {split!r}")
    return tasks[int(np_random.integers(len(tasks)))]


def safe_verify(scenario: Scenario, task: Task, answer: str | None) -> tuple[Any, str | None]:
    """``scenario.verify`` that never ends an episode: (verdict or None, error text or None).

    No answer -> (None, None). A verifier that fails (an LLM judge that is down after its retries)
    counts as not correct and the error is kept for the record.
    """
    if answer is None:
        return None, None
    try:
        return scenario.verify(task, answer), None
    except Exception as exc:  # noqa: BLE001 - scoring must not crash the run
        return None, f"{type(exc).__name__}: {exc}"


class WorldHandle:
    """A running world: the one given, or the scenario's own, opened on first use and closed by ``close``."""

    def __init__(self, scenario: Scenario, world: Any | None = None) -> None:
        self._scenario = scenario
        self._world = world
        self._stack: contextlib.ExitStack | None = None
        self._lock = threading.Lock()

    @property
    def world(self) -> Any:
        with self._lock:
            if self._world is None:
                self._stack = contextlib.ExitStack()
                self._world = self._stack.enter_context(self._scenario.open())
            return self._world

    def make_tools(self) -> dict[str, Any]:
        """A fresh tool set for one agent: the world's own (search, visit, click) and one instance of
        every registered tool (``protocol.register_tool``), built by its factory from the world."""
        world = self.world
        return {**world.make_tools(), **{name: TOOL_FACTORIES.get(name)(world) for name in TOOL_FACTORIES}}

    def close(self) -> None:
        with self._lock:
            if self._stack is not None:
                self._stack.close()
                self._stack = None
                self._world = None


def call_tool(tools: Mapping[str, Any], parsed: ParsedAction) -> tuple[ToolCall, str]:
    """Run a parsed tool call against ``tools``: the record and the text the agent reads.

    Every failure is a record with ok=False and an error text, never an exception.
    """
    name = parsed.tool_name or ""
    arguments = dict(parsed.arguments or {})
    tool = tools.get(name)
    if tool is None:
        error = f"unavailable: the tool '{name}' is not available here"
        return ToolCall(name, arguments, ok=False, error=error), f"Error ({name}): {error}"
    try:
        result = tool(arguments)
    except Exception as exc:  # tools promise not to raise; if one does, the episode still goes on
        error = f"internal: {type(exc).__name__}: {exc}"
        return ToolCall(name, arguments, ok=False, error=error), f"Error ({name}): {error}"
    meta = {k: v for k, v in result.meta.items() if isinstance(v, (str, int, float, bool)) or v is None}
    record = ToolCall(name, arguments, ok=result.ok, error=result.error, latency_s=result.latency_s, meta=meta)
    return record, result.text
