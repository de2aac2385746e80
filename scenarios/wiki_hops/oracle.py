"""A scripted oracle that solves wiki-hops tasks through the agents' tools only.

For each hop it searches the entity's name (for a chained hop: the name it READ at the previous hop,
never the gold answer), takes the hit whose title is exactly that name, visits it with the hop's
question as the goal (every page of the text when the article is long), and reads the value from the
infobox line ``Label | Value [n]`` (a count from its ``Number of ...`` row, else by counting the items of the
reverse-relation list). Chains are then
combined as the task's ``metadata`` says (``last``, ``min``, ``max``). With ``visit`` in ``auto``
browser mode, JavaScript pages are rendered by Chromium transparently.

It proves every task is solvable with the tools, measures the tools end to end, and gives the
decomposition a perfect sub-agent would report.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mgrpo_scenarios.base import Task
from mgrpo_tools.base import Tool, ToolResult

from .world import RELATION_BY_KEY, REVERSE_BY_KEY

__all__ = ["OracleRun", "solve", "read_relation", "combine", "read_infobox", "count_list", "page_body"]

_LABELS: dict[str, str] = {key: rel.label for (_, key), rel in RELATION_BY_KEY.items()}
_NUMERIC = {key for (_, key), rel in RELATION_BY_KEY.items() if rel.is_numeric}
_LINK_MARKER = re.compile(r"\s*\[\d+\]$")
_THOUSANDS = re.compile(r"^\d{1,3}(,\d{3})+$")
_MAX_PAGES = 20


@dataclass
class OracleRun:
    """What the oracle did: its ``answer``, the answer it read at each hop (in hop order), and every
    tool call as ``(tool name, arguments, ok, latency seconds)``."""

    answer: str
    hop_answers: list[str]
    steps: list[tuple[str, dict[str, Any], bool, float]] = field(default_factory=list)
    error: str | None = None

    @property
    def tool_seconds(self) -> float:
        return sum(step[3] for step in self.steps)


def page_body(result_text: str) -> str:
    """The page text of a ``visit`` result, without the goal line and the Title/URL/Page header."""
    head, sep, body = result_text.partition("\n\n")
    return body if sep and "\nPage " in "\n" + head else result_text


def read_infobox(text: str, label: str) -> str | None:
    """The value of the infobox row ``Label | Value [n]`` (link marker stripped), or None."""
    prefix = f"{label} | "
    for line in text.split("\n"):
        if line.startswith(prefix):
            return _LINK_MARKER.sub("", line[len(prefix):]).strip()
    return None


def count_list(text: str, heading: str) -> int:
    """Items (``- ...`` lines) of the section ``## Heading``; 0 when the page has no such section."""
    lines = text.split("\n")
    try:
        start = lines.index(f"## {heading}")
    except ValueError:
        return 0
    count = 0
    for line in lines[start + 1:]:
        if line.startswith("#") or line == "Links:":
            break
        if line.startswith("- "):
            count += 1
    return count


class _Solver:
    def __init__(self, tools: Mapping[str, Tool]) -> None:
        self.tools = tools
        self.steps: list[tuple[str, dict[str, Any], bool, float]] = []

    def call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        result = self.tools[name](arguments)
        self.steps.append((name, arguments, result.ok, result.latency_s))
        return result

    def find(self, name: str) -> str | None:
        """The URL of the page titled exactly ``name``, from the search tool."""
        for query in (name, f'"{name}"'):
            result = self.call("search", {"queries": [query]})
            if not result.ok:
                continue
            for hit in result.meta.get("hits", []):
                if hit.get("title") == name:
                    return hit["url"]
        return None

    def read(self, url: str, goal: str) -> str:
        """The whole text of the page at ``url`` (every page of it), headers removed."""
        first = self.call("visit", {"url": url, "goal": goal})
        if not first.ok:
            raise LookupError(f"visit failed for {url}: {first.error}")
        bodies = [page_body(first.text)]
        pages = int(first.meta.get("pages", 1) or 1)
        for page in range(2, min(pages, _MAX_PAGES) + 1):
            more = self.call("visit", {"url": url, "goal": goal, "page": page})
            if not more.ok:
                raise LookupError(f"visit failed for {url} page {page}: {more.error}")
            bodies.append(page_body(more.text))
        return "\n".join(bodies)

    def hop(self, entity: str, question: str, relation: str) -> str:
        url = self.find(entity)
        if url is None:
            raise LookupError(f"no search hit titled {entity!r}")
        return read_relation(relation, self.read(url, question))


def read_relation(relation: str, text: str) -> str:
    """The value of ``relation`` on a page's text: its infobox row, or for a reverse relation its count
    row (``Number of works | 3``), else the items of its list.

    Raises:
        LookupError: unknown relation, or the text has no such row (for a reverse relation: neither the
            count row nor the list; a page whose list is empty has neither, and a text that is only part
            of a page may lack both, so "0" is never read from an absence: the oracle's tiny sub-agent
            once reported 0 for every count it was asked, from the first 200 characters of the page).
    """
    if relation in REVERSE_BY_KEY:
        reverse = REVERSE_BY_KEY[relation]
        counted = read_infobox(text, reverse.count_label)
        if counted is not None:
            return _LINK_MARKER.sub("", counted).strip()
        if f"## {reverse.heading}" not in text.split("\n"):
            raise LookupError(f"no '{reverse.count_label}' row and no '{reverse.heading}' list in the text")
        return str(count_list(text, reverse.heading))
    if relation not in _LABELS:
        raise LookupError(f"unknown relation {relation!r}")
    value = read_infobox(text, _LABELS[relation])
    if value is None:
        raise LookupError(f"no '{_LABELS[relation]}' row on the page")
    if relation in _NUMERIC and _THOUSANDS.match(value):
        value = value.replace(",", "")
    return value


def combine(task: Task, finals: list[tuple[str, str]]) -> str:
    """The final answer from each chain's (entity read at its last hop, value read there), as the
    task's ``metadata["combine"]`` says: ``last`` value, or the entity with the ``min``/``max`` value.

    Raises:
        ValueError: values that should be numbers are not.
    """
    how = task.metadata.get("combine", "last")
    if how == "last":
        return finals[-1][1]
    pick = min if how == "min" else max
    return pick(finals, key=lambda f: int(f[1]))[0]


def solve(task: Task, tools: Mapping[str, Tool]) -> OracleRun:
    """Solve ``task`` with ``tools`` (``search`` and ``visit``); never raises for a failed lookup:
    the run then carries an ``error`` and an empty answer."""
    solver = _Solver(tools)
    hop_answers = [""] * len(task.hops)
    chains = [list(c) for c in task.metadata.get("chains", [list(range(len(task.hops)))])]
    finals: list[tuple[str, str]] = []  # (entity read at the chain's last hop, value read there)
    try:
        for chain in chains:
            name = task.hops[chain[0]].entity  # the name the question itself gives
            for i in chain:
                hop = task.hops[i]
                value = solver.hop(name, hop.question.replace(hop.entity, name), hop.relation)
                hop_answers[i] = value
                entity, name = name, value
            finals.append((entity, hop_answers[chain[-1]]))
    except (LookupError, KeyError, ValueError) as exc:
        return OracleRun("", hop_answers, solver.steps, error=str(exc))
    try:
        answer = combine(task, finals)
    except ValueError as exc:
        return OracleRun("", hop_answers, solver.steps, error=f"cannot compare: {exc}")
    return OracleRun(answer, hop_answers, solver.steps)
