"""Scripted policies: an oracle that solves tasks through the protocol, and a random one.

Both follow :class:`mgrpo_env.rollout.Policy` (a list of requests in, a list of texts out) and are
stateless: everything they need is in the request's chat history, so one instance serves any
number of concurrent episodes.

The oracle decomposes the question with the task's gold hops (the ``task`` field of a request is
the "cheat" channel that only scripted policies read), delegates one hop per sub-agent - for a
chained hop it names the entity the previous sub-agent REPORTED, not the gold one - and combines
the reports. Its delegations are plain text (no machine-readable hints), so they are demonstrations
a learned main agent can imitate. Its sub-agent recovers the entity and relation by matching the
subtask against the task's hop questions, searches the entity, visits the exactly matching hit (every page of it)
and reads the value with the scenario's reader. Scenarios opt in by providing
``oracle_read(relation, page_text) -> str`` (raises LookupError) and
``oracle_combine(task, finals) -> str``; tasks may give ``metadata["chains"]`` (lists of hop
indices, default one chain of all hops).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from mgrpo_scenarios import Scenario, ScriptsOracle, Task

from .protocol import parse_action
from .rollout import PolicyRequest
from .spaces import action_space

__all__ = ["OraclePolicy", "RandomPolicy"]

_RESPONSE = re.compile(r"^<tool_response>\n?(.*?)\n?</tool_response>$", re.DOTALL)
_PAGE = re.compile(r"^Page (\d+) of (\d+)", re.MULTILINE)


def _call(name: str, **arguments: Any) -> str:
    return f"<think>{name} next</think><tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def _unwrap(observation: str) -> str:
    match = _RESPONSE.match(observation.strip())
    return match.group(1) if match else observation


def _exchanges(messages: Sequence[dict[str, str]], role: str) -> list[tuple[Any, str]]:
    """(parsed assistant action, the observation that followed it) for each past turn."""
    out = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        reply = messages[i + 1]["content"] if i + 1 < len(messages) else ""
        out.append((parse_action(message["content"], role=role, allowed_tools=_ANY_TOOLS), reply))
    return out


_ANY_TOOLS = ("delegate", "reason", "search", "visit", "click")


class OraclePolicy:
    """Scripted solver for ``role`` of a scenario that provides the oracle hooks.

    Roles: "main" and "sub" (the hierarchy), or "single" (one agent doing every hop itself, for the
    single-agent baseline's demonstrations).
    """

    def __init__(self, scenario: Scenario, role: str) -> None:
        if role not in ("main", "sub", "single"):
            raise ValueError(f"role must be 'main', 'sub' or 'single', got {role!r}")
        if not isinstance(scenario, ScriptsOracle):
            raise ValueError(f"scenario {getattr(scenario, 'name', scenario)!r} has no oracle_read() and oracle_combine() "
                             "(mgrpo_scenarios.ScriptsOracle): no oracle policy")
        self.scenario = scenario
        self.role = role
        # The tiny profile: every action a copy from a known place (see mgrpo_scenarios' wiki-hops).
        self.tiny = getattr(scenario, "profile", "full") == "tiny"

    @staticmethod
    def _subtask(hop: Any, name: str) -> str:
        """A hop as a subtask: its question, about ``name`` (the entity the previous report named)."""
        return hop.question.replace(hop.entity, name)

    def _visit_url(self, hit_url: str | None, name: str) -> str | None:
        """The search hit's URL, or (tiny profile) the scenario's page of that name, MediaWiki-style
        ``.../wiki/<Name>``: a copy of the entity instead of a look-up of its search result."""
        return self.scenario.page_url(name) if self.tiny else hit_url

    def __call__(self, requests: Sequence[PolicyRequest]) -> list[str]:
        act = {"main": self._main, "sub": self._sub, "single": self._single}[self.role]
        return [act(r) for r in requests]

    # -- single: every hop itself (search -> visit every page -> read), then combine -------------

    def _single(self, request: PolicyRequest) -> str:
        task: Task = request.task
        chains, order = hop_order(task)
        values: dict[tuple[int, int], str] = {}
        names: dict[tuple[int, int], str] = {}

        def entity(h: int) -> str:
            c, pos = order[h]
            return task.hops[chains[c][pos]].entity if pos == 0 else values[(c, pos - 1)]

        h, searches, url, pages, page = 0, 0, None, [], 0
        for parsed, reply in _exchanges(request.messages, "single"):
            body = _unwrap(reply)
            if parsed.tool_name == "search" and h < len(order):
                searches += 1
                url = self._visit_url(_find_hit(body, entity(h)), entity(h))
            elif parsed.tool_name == "visit" and h < len(order):
                pages.append(_page_text(body))
                found = _PAGE.search(body)
                page = int(found.group(1)) if found else 1
                if not found or page >= int(found.group(2)) or self._read_now(order, chains, task, h, pages):
                    try:
                        value = self.scenario.oracle_read(task.hops[chains[order[h][0]][order[h][1]]].relation, "\n".join(pages))
                    except LookupError:
                        return "<think>missing</think><answer>unknown</answer>"
                    names[order[h]], values[order[h]] = entity(h), value
                    h, searches, url, pages, page = h + 1, 0, None, [], 0
        if h == len(order):
            return self._combined(task, chains, names, values)
        relation = task.hops[chains[order[h][0]][order[h][1]]].relation
        if url is None:
            if searches == 0:
                return _call("search", queries=[entity(h)])
            if searches == 1:
                return _call("search", queries=[f'"{entity(h)}"'])
            return "<think>not found</think><answer>unknown</answer>"
        if page == 0:
            return _call("visit", url=url, goal=f"{relation} of {entity(h)}")
        return _call("visit", url=url, goal=f"{relation} of {entity(h)}", page=page + 1)

    def _combined(self, task: Task, chains: list[list[int]], names: dict[tuple[int, int], str],
                  values: dict[tuple[int, int], str]) -> str:
        """The single agent's answer once every hop is read: each chain's last (entity, value), combined."""
        finals = [(names[(c, len(ch) - 1)], values[(c, len(ch) - 1)]) for c, ch in enumerate(chains)]
        try:
            answer = self.scenario.oracle_combine(task, finals)
        except (LookupError, ValueError):
            answer = "unknown"
        return f"<think>combine</think><answer>{answer or 'unknown'}</answer>"

    def _read_now(self, order: list[tuple[int, int]], chains: list[list[int]], task: Task, h: int, pages: list[str]) -> bool:
        """Tiny profile: the goal's line comes first, so read it without paging on (when it is there)."""
        if not self.tiny:
            return False
        try:
            self.scenario.oracle_read(task.hops[chains[order[h][0]][order[h][1]]].relation, "\n".join(pages))
        except LookupError:
            return False
        return True

    # -- main: one delegation per hop, then combine -------------------------------------------

    def _main(self, request: PolicyRequest) -> str:
        task: Task = request.task
        chains, order = hop_order(task)
        reports = [_unwrap(reply) for parsed, reply in _exchanges(request.messages, "main") if parsed.tool_name == "delegate"]
        names: list[list[str]] = [[] for _ in chains]  # the entity each delegated hop was about
        for c, pos in order[: len(reports)]:
            names[c].append(task.hops[chains[c][pos]].entity if pos == 0 else _last_report(reports, order, c, pos))
        if len(reports) < len(order):
            c, pos = order[len(reports)]
            hop = task.hops[chains[c][pos]]
            name = hop.entity if pos == 0 else _last_report(reports, order, c, pos)
            # the subtask is plain text: a learned sub-agent must read it, so the oracle's does too
            return _call("delegate", task=self._subtask(hop, name))
        finals = []
        for c, chain in enumerate(chains):
            last = order.index((c, len(chain) - 1))
            finals.append((names[c][-1], reports[last]))
        try:
            answer = self.scenario.oracle_combine(task, finals)
        except (LookupError, ValueError):
            answer = "unknown"
        return f"<think>combine the reports</think><answer>{answer or 'unknown'}</answer>"

    # -- sub: search -> visit every page -> read -> report ---------------------------------------

    def _sub(self, request: PolicyRequest) -> str:
        first = request.messages[1]["content"]
        subtask = first.removeprefix("Subtask: ").split("\nContext: ", 1)[0].strip()
        found = _hop_of(request.task, subtask)
        if found is None:
            return "<think>not a hop of this question</think><result>I cannot tell what to look up.</result>"
        entity, relation = found
        history = _exchanges(request.messages, "sub")
        if not history:
            return _call("search", queries=[entity])
        parsed, reply = history[-1]
        body = _unwrap(reply)
        if parsed.tool_name == "search":
            url = self._visit_url(_find_hit(body, entity), entity)
            if url:
                return _call("visit", url=self._visit_url(url, entity), goal=f"{relation} of {entity}")
            searches = sum(1 for p, _ in history if p.tool_name == "search")
            if searches == 1:
                return _call("search", queries=[f'"{entity}"'])
            return f"<think>not found</think><result>No page titled {entity} was found.</result>"
        if parsed.tool_name == "visit":
            page = _PAGE.search(body)
            read_now = False
            if self.tiny:  # the goal's line comes first: no paging on when it is there
                try:
                    self.scenario.oracle_read(relation, _page_text(body))
                    read_now = True
                except LookupError:
                    pass
            if page and int(page.group(1)) < int(page.group(2)) and not read_now:
                return _call("visit", url=parsed.arguments["url"], goal=parsed.arguments["goal"], page=int(page.group(1)) + 1)
            url = parsed.arguments["url"]
            text = "\n".join(
                _page_text(_unwrap(r)) for p, r in history if p.tool_name == "visit" and p.arguments.get("url") == url
            )
            try:
                value = self.scenario.oracle_read(relation, text)
            except LookupError as exc:
                return f"<think>missing</think><result>Not found: {exc}</result>"
            return f"<think>read it</think><result>{value}</result>"
        return f"<think>lost</think><result>No answer for {entity}.</result>"


def hop_order(task: Task) -> tuple[list[list[int]], list[tuple[int, int]]]:
    """(chains of hop indices, the (chain, position) of every hop in the order they are solved)."""
    chains = [list(c) for c in task.metadata.get("chains", [list(range(len(task.hops)))])]
    return chains, [(c, pos) for c in range(len(chains)) for pos in range(len(chains[c]))]


def _hop_of(task: Task, subtask: str) -> tuple[str, str] | None:
    """(entity, relation) of the hop whose question, with some entity in place of the gold one, is
    exactly ``subtask`` (the entity of a chained hop is whatever the previous report said)."""
    for hop in task.hops:
        if not hop.entity or hop.entity not in hop.question:
            continue
        prefix, _, suffix = hop.question.partition(hop.entity)
        if subtask.startswith(prefix) and subtask.endswith(suffix) and len(subtask) > len(prefix) + len(suffix):
            return subtask[len(prefix) : len(subtask) - len(suffix)], hop.relation
    return None


def _last_report(reports: list[str], order: list[tuple[int, int]], chain: int, pos: int) -> str:
    return reports[order.index((chain, pos - 1))]


def _find_hit(search_text: str, title: str) -> str | None:
    lines = search_text.splitlines()
    for i, line in enumerate(lines[:-1]):
        if re.fullmatch(rf"\[\d+\] {re.escape(title)}", line) and lines[i + 1].startswith("URL: "):
            return lines[i + 1][5:].strip()
    return None


def _page_text(visit_text: str) -> str:
    """A visit result without its Goal / Title / URL / Page header."""
    head, sep, body = visit_text.partition("\n\n")
    return body if sep and "\nPage " in "\n" + head else visit_text


class RandomPolicy:
    """Samples actions from the role's :class:`ProtocolText` space (half well-formed, half noise)."""

    def __init__(self, role: str, seed: int = 0, max_chars: int = 4000) -> None:
        # A copy of the role's cached space, as the envs use: building a ProtocolText indexes ~55,000
        # characters (~50 ms, and megabytes allocated and freed) per policy, per episode in a soak.
        self.space = action_space(max_chars, role)
        self.space.seed(seed)

    def __call__(self, requests: Sequence[PolicyRequest]) -> list[str]:
        return [self.space.sample() for _ in requests]
