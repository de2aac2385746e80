"""An imperfect teacher: the scripted oracle with named decision mistakes, run through the env.

Real warm starts are cloned from agents that make the same decision mistakes again and again; RL's
job is to remove them. The oracle (:class:`~mgrpo_env.scripted.OraclePolicy`) makes none, so a model
cloned from it is left with a tiny model's idiosyncratic copy errors, which RL does not transfer to
held-out questions (docs/results/demo.md). This teacher makes decision mistakes, each drawn
independently at every decision of its kind and executed in the env, so every demonstration is a
coherent trajectory: the mistake and what the world answered to it.

Mistake kinds (:data:`MISTAKE_KINDS`), with the roles that make them:

``answer_early`` (main, single)
    Where the oracle would start the next hop (delegate it, or search for it), answer at once with a
    guess instead: the last hop's result (stopping one hop early: "the founder of X" answered where
    "the year the founder of X was born" was asked), or, before any result, the entity the question
    names. On a comparison question the guess names one of the two candidates, so it is right about
    half the time: a mistake the correctness reward pays. Give comparisons a rate of 0 there.
``report_without_visit`` (sub, single)
    Right after its first search, take a search hit's title as the hop's result without visiting:
    the title of a hit other than the entity (a plausible wrong entity; the tiny profile shows no
    snippets), or the entity itself when no other hit is listed. The expert score gives it 0.
``visit_wrong_hit`` (sub, single)
    Right after its first search, visit a hit other than the entity's page (when one is listed) and
    read the relation there: a wrong but well-sourced value. The expert score gives it 0.

The draw for a decision is a hash of (seed, task, episode, agent, chat length, kind), so the policy
stays stateless like the oracle (the single agent's past mistakes are recomputed from its chat), one
instance serves any number of concurrent episodes, and a collection is reproducible.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mgrpo_scenarios import Scenario, Task

from .protocol import parse_action
from .rollout import PolicyRequest
from .scripted import (
    _ANY_TOOLS,
    _PAGE,
    OraclePolicy,
    _call,
    _exchanges,
    _find_hit,
    _hop_of,
    _page_text,
    _unwrap,
    hop_order,
)

__all__ = ["MISTAKE_KINDS", "MISTAKE_ROLES", "MistakeRate", "ImperfectTeacher", "search_hits"]

#: Every mistake kind the teacher knows, with the roles that can make it.
MISTAKE_ROLES: dict[str, tuple[str, ...]] = {
    "answer_early": ("main", "single"),
    "report_without_visit": ("sub", "single"),
    "visit_wrong_hit": ("sub", "single"),
}
MISTAKE_KINDS: tuple[str, ...] = tuple(MISTAKE_ROLES)

_HIT = re.compile(r"^\[\d+\] (.+)$", re.MULTILINE)
#: The think text of a mistaken turn: plain words a learned policy can imitate, like the oracle's.
GUESS_THINK = {"answer_early": "answer now", "report_without_visit": "report now", "visit_wrong_hit": "visit next"}


@dataclass(frozen=True)
class MistakeRate:
    """The probability of one mistake kind at each decision of its kind.

    Attributes:
        rate: the default probability, in [0, 1].
        roles: per-role overrides (``{"single": 0.2}``).
        question_kinds: per question-kind overrides (``{"comparison": 0.0}``); they win over ``roles``.
    """

    rate: float = 0.0
    roles: Mapping[str, float] = field(default_factory=dict)
    question_kinds: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, value in [("rate", self.rate), *self.roles.items(), *self.question_kinds.items()]:
            if not 0.0 <= float(value) <= 1.0:  # also refuses NaN
                raise ValueError(f"mistake rate {name!r} must be in [0, 1], got {value!r}")

    def for_(self, role: str, question_kind: str) -> float:
        if question_kind in self.question_kinds:
            return float(self.question_kinds[question_kind])
        return float(self.roles.get(role, self.rate))


def search_hits(search_text: str) -> list[str]:
    """The titles a search result lists, in order."""
    return [t.strip() for t in _HIT.findall(search_text)]


class ImperfectTeacher(OraclePolicy):
    """The oracle for ``role`` with :data:`MISTAKE_KINDS` drawn at ``rates`` (kind -> :class:`MistakeRate`
    or a plain probability). Every rate 0 (or ``rates`` empty) is exactly the oracle.

    ``seed`` chooses the draws: demonstrations drawn with several seeds show the same kind of state
    with and without the mistake, so a cloned policy learns the rate, not a per-question choice.
    """

    def __init__(self, scenario: Scenario, role: str, rates: Mapping[str, MistakeRate | float] | None = None,
                 *, seed: int = 0) -> None:
        super().__init__(scenario, role)
        self.rates: dict[str, MistakeRate] = {}
        for kind, rate in (rates or {}).items():
            if kind not in MISTAKE_ROLES:
                raise ValueError(f"unknown mistake kind {kind!r}; known: {', '.join(MISTAKE_KINDS)}")
            self.rates[kind] = rate if isinstance(rate, MistakeRate) else MistakeRate(float(rate))
        self.seed = seed

    def _p(self, kind: str, task: Task) -> float:
        rate = self.rates.get(kind)
        return 0.0 if rate is None or self.role not in MISTAKE_ROLES[kind] else rate.for_(self.role, task.kind)

    def _draw(self, request: PolicyRequest, kind: str, position: int | None = None) -> bool:
        """Whether the decision taken when the chat had ``position`` messages (default: now) is ``kind``."""
        p = self._p(kind, request.task)
        if p <= 0.0:
            return False
        at = len(request.messages) if position is None else position
        key = f"{self.seed}|{request.task.id}|{request.episode}|{request.agent}|{at}|{kind}"
        return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2**64 < p

    # -- main ----------------------------------------------------------------------------------

    def _main(self, request: PolicyRequest) -> str:
        task = request.task
        chains, order = hop_order(task)
        hops = len(order)
        reports = [_unwrap(reply) for parsed, reply in _exchanges(request.messages, "main") if parsed.tool_name == "delegate"]
        if len(reports) < hops and self._draw(request, "answer_early"):
            guess = reports[-1] if reports else task.hops[chains[0][0]].entity
            return f"<think>{GUESS_THINK['answer_early']}</think><answer>{guess}</answer>"
        return super()._main(request)

    # -- sub -----------------------------------------------------------------------------------

    def _sub(self, request: PolicyRequest) -> str:
        history = _exchanges(request.messages, "sub")
        if len(history) == 1 and history[0][0].tool_name == "search":
            first = request.messages[1]["content"]
            subtask = first.removeprefix("Subtask: ").split("\nContext: ", 1)[0].strip()
            found = _hop_of(request.task, subtask)
            if found is not None:
                entity, relation = found
                results = _unwrap(history[0][1])
                others = [t for t in search_hits(results) if t != entity]
                if self._draw(request, "report_without_visit"):
                    return f"<think>{GUESS_THINK['report_without_visit']}</think><result>{others[0] if others else entity}</result>"
                if others and self._draw(request, "visit_wrong_hit"):
                    url = self._visit_url(_find_hit(results, others[0]), others[0])
                    if url:
                        return _call("visit", url=url, goal=f"{relation} of {entity}")
        return super()._sub(request)

    # -- single: the oracle's walk over the hops, with the same mistakes ----------------------

    def _single(self, request: PolicyRequest) -> str:
        if not any(self._p(kind, request.task) > 0 for kind in MISTAKE_KINDS):
            return super()._single(request)
        task: Task = request.task
        chains, order = hop_order(task)
        values: dict[tuple[int, int], str] = {}
        names: dict[tuple[int, int], str] = {}

        def hop_of(h: int) -> Any:
            return task.hops[chains[order[h][0]][order[h][1]]]

        def entity(h: int) -> str:
            c, pos = order[h]
            return task.hops[chains[c][pos]].entity if pos == 0 else values[(c, pos - 1)]

        def done(h: int, value: str) -> None:
            names[order[h]], values[order[h]] = entity(h), value

        h, searches, url, pages = 0, 0, None, []
        messages = request.messages
        for index, message in enumerate(messages):
            if message["role"] != "assistant" or h >= len(order):
                continue
            parsed = parse_action(message["content"], role="single", allowed_tools=_ANY_TOOLS)
            body = _unwrap(messages[index + 1]["content"]) if index + 1 < len(messages) else ""
            after = index + 2  # the chat length when the next decision was taken
            if parsed.tool_name == "search":
                searches += 1
                titles = search_hits(body)
                others = [t for t in titles if t != entity(h)]
                if searches == 1 and self._draw(request, "report_without_visit", after):
                    done(h, others[0] if others else entity(h))
                    h, searches, url, pages = h + 1, 0, None, []
                    continue
                wrong = searches == 1 and bool(others) and self._draw(request, "visit_wrong_hit", after)
                target = others[0] if wrong else entity(h)
                url = self._visit_url(_find_hit(body, target), target)
            elif parsed.tool_name == "visit":
                pages.append(_page_text(body))
                found = _PAGE.search(body)
                page = int(found.group(1)) if found else 1
                if not found or page >= int(found.group(2)) or self._read_now(order, chains, task, h, pages):
                    try:
                        value = self.scenario.oracle_read(hop_of(h).relation, "\n".join(pages))
                    except LookupError:
                        return "<think>missing</think><answer>unknown</answer>"
                    done(h, value)
                    h, searches, url, pages = h + 1, 0, None, []
        if h == len(order):
            return self._combined(task, chains, names, values)
        if searches == 0 and url is None and self._draw(request, "answer_early"):
            last = max(values, key=order.index) if values else None
            guess = values[last] if last is not None else task.hops[chains[0][0]].entity
            return f"<think>{GUESS_THINK['answer_early']}</think><answer>{guess}</answer>"
        relation = hop_of(h).relation
        if url is None:
            if searches == 0:
                return _call("search", queries=[entity(h)])
            if searches == 1:
                return _call("search", queries=[f'"{entity(h)}"'])
            return "<think>not found</think><answer>unknown</answer>"
        if not pages:
            return _call("visit", url=url, goal=f"{relation} of {entity(h)}")
        return _call("visit", url=url, goal=f"{relation} of {entity(h)}", page=len(pages) + 1)


def teacher_policies(scenario: Scenario, roles: Sequence[str], rates: Mapping[str, MistakeRate | float], *,
                     seed: int) -> dict[str, ImperfectTeacher]:
    """One teacher per role, sharing ``rates`` and ``seed``."""
    return {role: ImperfectTeacher(scenario, role, rates, seed=seed) for role in roles}
