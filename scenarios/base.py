"""The scenario protocol: setup / tasks / verify / teardown, plus an oracle.

A scenario is a source of tasks (questions with gold answers) and a world the agents act in
(the tools they may call). ``with scenario.open() as world:`` starts whatever the world needs
(a loopback web server, a search index, a browser) and stops it on exit.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from mgrpo_tools.base import Tool

__all__ = ["Hop", "Task", "Verdict", "World", "Scenario", "DelegationMatch", "AttributesDelegations",
           "DELEGATION_MISSES", "require_browser", "split_tasks", "split_parts", "ChoosesRoleTools", "StylesPrompts",
           "NeedsBuilding", "NeedsBrowser", "NamesWorldTokens", "GroupsWorldTokens", "HasDefaultSplit", "ScriptsOracle",
           "ShipsOracle", "AnswersSubtasks"]


@dataclass(frozen=True)
class Hop:
    """One step of a multi-hop question, with its own gold answer.

    Attributes:
        question: a self-contained sub-question a sub-agent could be given ("Who founded Velmora Press?").
        answer: the gold answer of this hop.
        entity: the name of the entity whose page holds the answer.
        relation: the relation read on that page (e.g. "founded_by"); scenario-specific.
    """

    question: str
    answer: str
    entity: str = ""
    relation: str = ""


@dataclass(frozen=True)
class Task:
    """A question with its gold answer.

    Attributes:
        id: unique and stable across runs (same seed and version -> same id and content).
        question: what the main agent is asked.
        answer: the gold final answer.
        split: the split it belongs to, e.g. "stage2/test".
        hops: gold decomposition (empty when the scenario has none); drives the expert reward.
        kind: question family ("lookup", "chain", "comparison", "aggregation", ...).
        aliases: other accepted spellings of the answer.
        metadata: anything else (level, root URL, attached files, ...).
    """

    id: str
    question: str
    answer: str
    split: str = ""
    hops: tuple[Hop, ...] = ()
    kind: str = ""
    aliases: tuple[str, ...] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "question": self.question,
            "answer": self.answer,
            "split": self.split,
            "hops": [vars(h).copy() for h in self.hops],
            "kind": self.kind,
            "aliases": list(self.aliases),
            "metadata": dict(self.metadata),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Task:
        return cls(
            id=data["id"],
            question=data["question"],
            answer=data["answer"],
            split=data.get("split", ""),
            hops=tuple(Hop(**h) for h in data.get("hops", ())),
            kind=data.get("kind", ""),
            aliases=tuple(data.get("aliases", ())),
            metadata=dict(data.get("metadata", {})),
        )


@dataclass(frozen=True)
class Verdict:
    """A verifier's judgement: ``correct`` (the r_correct bit) and a graded ``score`` in [0, 1]."""

    correct: bool
    score: float
    details: Mapping[str, Any] = field(default_factory=dict)


@runtime_checkable
class World(Protocol):
    """A running world. ``tools`` is a ready set of tools; ``make_tools()`` gives a fresh set with
    its own browsing state (the last visited page that ``click`` follows), one per agent."""

    tools: dict[str, Tool]

    def make_tools(self) -> dict[str, Tool]: ...


@runtime_checkable
class Scenario(Protocol):
    """What every scenario provides. ``metadata`` holds at least ``{"version": ...}``; a change that
    alters tasks or rewards bumps the version."""

    name: str
    metadata: Mapping[str, Any]

    def splits(self) -> list[str]: ...

    def tasks(self, split: str) -> Iterator[Task]: ...

    def open(self) -> Any:  # a context manager yielding a World
        ...

    def verify(self, task: Task, prediction: str) -> Verdict: ...


# -- optional hooks: each one declared here, each read with isinstance where it is used ---------------------
# A scenario that lacks a hook a run needs is refused in one line where the run asks for it (the oracle
# policies, ``expert_reference: subtask``, ``delegation_credit``); the others have a stated default.


@runtime_checkable
class ChoosesRoleTools(Protocol):
    """``role_tools``: role -> the tool names it holds (names of ``mgrpo_env.protocol.TOOLS``); the envs build
    each role's prompt and argument checks from it. Absent: each role's own default (``RoleSpec.tools``:
    delegate + reason for the main agent, search + visit + click otherwise)."""

    role_tools: Mapping[str, Any]


@runtime_checkable
class StylesPrompts(Protocol):
    """``prompt_style``: ``"full"`` or ``"compact"`` system prompts (a tiny world's tiny models read the
    compact ones). Absent: ``"full"``."""

    prompt_style: str


@runtime_checkable
class NeedsBuilding(Protocol):
    """``build()``: make the world's files before the first episode (an evaluation runs it once, timed
    apart). Absent: nothing to build."""

    def build(self) -> Any: ...


@runtime_checkable
class NeedsBrowser(Protocol):
    """``browser_needed``: why its pages need a browser (JavaScript), or None; preflight then starts
    Chromium once before any work. Absent: no browser needed."""

    browser_needed: str | None


@runtime_checkable
class NamesWorldTokens(Protocol):
    """``world_tokens()``: the names the tiny tokenizer keeps whole. Absent: a tokenizer of the protocol's
    words only."""

    def world_tokens(self) -> Any: ...


@runtime_checkable
class GroupsWorldTokens(Protocol):
    """``world_token_groups()``: names that stand for one another in the warm start's demonstrations
    (group -> names). Absent: no groups."""

    def world_token_groups(self) -> Mapping[str, Any]: ...


@runtime_checkable
class HasDefaultSplit(Protocol):
    """``default_split``: the split ``mgrpo eval`` uses when the config keeps the default ``stage2/test``
    and the scenario has none (a QA file, a benchmark). Absent: that split is refused as unknown."""

    default_split: str


@runtime_checkable
class ScriptsOracle(Protocol):
    """``oracle_read`` and ``oracle_combine``: what the scripted oracle policies (``mgrpo_env.scripted``)
    read a page for and how they combine hop answers. Absent: no oracle policy (refused in one line: the
    warm start's demonstrations and ``mgrpo eval --agent oracle`` need it)."""

    def oracle_read(self, *args: Any, **kwargs: Any) -> Any: ...

    def oracle_combine(self, *args: Any, **kwargs: Any) -> Any: ...


@runtime_checkable
class ShipsOracle(Protocol):
    """``oracle(task, tools)``: a solver that runs without the env (``mgrpo eval --agent scenario-oracle``).
    Absent: refused in one line there."""

    def oracle(self, task: Task, tools: Mapping[str, Tool]) -> Any: ...


@runtime_checkable
class AnswersSubtasks(Protocol):
    """``subtask_answer(task, subtask)``: the gold answer of a delegated subtask, what
    ``expert_reference: subtask`` scores a report against. Absent: that setting is refused at load."""

    def subtask_answer(self, task: Task, subtask: str) -> Any: ...


#: Why a delegation asks none of the task's hops (:attr:`DelegationMatch.miss`).
DELEGATION_MISSES = ("other_relation", "other_entity")


@dataclass(frozen=True)
class DelegationMatch:
    """Which of a task's gold hops a delegated subtask asks.

    Attributes:
        hop: the index in ``task.hops`` of the hop whose question the subtask is (as the scenario
            compares texts); None when it is none of them.
        miss: when ``hop`` is None, why: ``"other_relation"`` (it names an entity of the task's hops but
            asks another relation of it) or ``"other_entity"`` (any other question).
    """

    hop: int | None
    miss: str = ""

    def __post_init__(self) -> None:
        if (self.hop is None) != (self.miss in DELEGATION_MISSES):
            raise ValueError(f"a DelegationMatch has a hop or a miss in {DELEGATION_MISSES}, got hop={self.hop!r} "
                             f"miss={self.miss!r}")


@runtime_checkable
class AttributesDelegations(Protocol):
    """Optional scenario capability: with a gold decomposition into hops, say which hop a delegation asks
    and whether a report answers a hop. :mod:`mgrpo_env.attribution` then tells, per held-out episode,
    which role lost the answer (the main agent never asked a needed hop or failed to combine right
    reports; a sub-agent reported a hop wrong or without a result). A scenario without it has no such
    figures (and no error): ``isinstance(scenario, AttributesDelegations)`` decides."""

    def match_delegation(self, task: Task, subtask: str) -> DelegationMatch: ...

    def hop_answered(self, task: Task, hop: int, report: str) -> bool: ...


def split_parts(split: str) -> list[str]:
    """The splits a split expression names: ``"stage2/test+stage2/heldout"`` -> both, in order."""
    parts = [p.strip() for p in split.split("+")]
    if not all(parts):
        raise ValueError(f"split {split!r} has an empty part (write 'a+b')")
    return parts


def split_tasks(scenario: Scenario, split: str) -> list[Task]:
    """The tasks of a split expression: one split, or several joined by ``+`` (their tasks in order,
    each task once), e.g. an evaluation over two disjoint held-out splits."""
    out: list[Task] = []
    seen: set[str] = set()
    for part in split_parts(split):
        for task in scenario.tasks(part):
            if task.id not in seen:
                seen.add(task.id)
                out.append(task)
    return out


def require_browser(scenario: str, reason: str | None) -> None:
    """Refuse to open a world whose pages need Chromium when there is no Chromium executable.

    ``reason`` is the scenario's ``browser_needed`` (None: no browser needed). Without this check a
    missing browser only lowered every result: each JavaScript page read as empty text.

    Raises:
        mgrpo_tools.browser_check.BrowserUnavailable: one line, with how to install Chromium and how
            to run without it.
    """
    if reason is None:
        return
    from mgrpo_tools.browser_check import BrowserUnavailable
    from mgrpo_tools.chromium import INSTALL_HINT, default_chromium, find_chromium

    if find_chromium() is None:
        raise BrowserUnavailable(f"scenario {scenario!r} needs a browser ({reason}) but Chromium is not at "
                                 f"{default_chromium()}; {INSTALL_HINT}, or set browser_mode: never to run without it")
