"""``capitals``: a minimal mgrpo scenario in its own package (tasks, a world of tools, a verifier, an oracle).

Description:
    A seeded atlas of invented countries. Each task asks for one country's capital; the agents have
    one tool, ``search``, that returns the atlas entries mentioning the words of the query.

Splits:
    ``train`` and ``test`` (``num_countries`` // 2 each).

Arguments:
    seed: picks the names (same seed and version -> same tasks).
    num_countries: atlas size (default 20).

Version history:
    1: first version.

Registered through ``[project.entry-points."mgrpo.scenarios"]`` in this package's pyproject, so
after ``pip install`` it is ``mgrpo_scenarios.get("capitals")`` and ``mgrpo eval --scenario capitals``.
"""

from __future__ import annotations

import contextlib
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from mgrpo_scenarios import Task, Verdict
from mgrpo_tools.base import BaseTool, ToolError

__all__ = ["Capitals", "AtlasSearch", "VERSION"]

VERSION = "1"
SYLLABLES = ["ka", "lor", "ven", "mi", "tas", "ro", "del", "su", "nar", "bel", "qu", "ith"]


class AtlasSearch(BaseTool):
    """``search(queries)``: the atlas lines that contain every word of a query (case-insensitive)."""

    name = "search"
    description = "Look up the atlas; returns the entries containing all words of a query."
    parameters = {"type": "object", "properties": {"queries": {"type": "array", "items": {"type": "string"}}},
                  "required": ["queries"]}

    def __init__(self, atlas: dict[str, str]) -> None:
        self.lines = [f"{country}: capital {capital}" for country, capital in atlas.items()]

    def run(self, arguments: Any) -> str:
        queries = arguments.get("queries")
        if not isinstance(queries, list) or not queries or not all(isinstance(q, str) for q in queries):
            raise ToolError("arguments", "'queries' must be a non-empty list of strings")
        found = [line for q in queries for line in self.lines
                 if all(w in line.lower() for w in q.lower().split())]
        return "\n".join(dict.fromkeys(found)) or f"No entry matches {queries}."


@dataclass
class AtlasWorld:
    """The running world: a ready ``tools`` set, and ``make_tools()`` for one more agent."""

    atlas: dict[str, str]
    tools: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.tools = self.make_tools()

    def make_tools(self) -> dict[str, Any]:
        return {"search": AtlasSearch(self.atlas)}


@dataclass
class OracleRun:
    """What ``oracle`` returns: the answer and the tool calls it made (name, arguments, ok, latency)."""

    answer: str
    steps: list[tuple[str, dict[str, Any], bool, float]]


def _name(rng: random.Random) -> str:
    return "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 3))).capitalize()


class Capitals:
    """The scenario: ``name``, ``metadata``, ``splits``, ``tasks``, ``open``, ``verify``, ``oracle``."""

    name = "capitals"
    default_split = "test"  # what `mgrpo eval` evaluates when no --split is given

    def __init__(self, seed: int = 0, num_countries: int = 20) -> None:
        if num_countries < 2:
            raise ValueError(f"num_countries must be >= 2, got {num_countries}")
        rng = random.Random(seed)
        self.atlas: dict[str, str] = {}
        while len(self.atlas) < num_countries:
            self.atlas.setdefault(_name(rng) + "ia", _name(rng))
        self.metadata = {"version": VERSION, "seed": seed, "num_countries": num_countries}

    def splits(self) -> list[str]:
        return ["train", "test"]

    def tasks(self, split: str) -> Iterator[Task]:
        if split not in self.splits():
            raise KeyError(f"capitals: unknown split {split!r}; valid: {self.splits()}")
        items = sorted(self.atlas.items())
        half = len(items) // 2
        for country, capital in items[:half] if split == "train" else items[half:]:
            yield Task(id=f"capitals-{country}", question=f"What is the capital of {country}?", answer=capital,
                       split=split, kind="lookup")

    @contextlib.contextmanager
    def open(self) -> Iterator[AtlasWorld]:
        yield AtlasWorld(self.atlas)  # nothing to start or stop; a web world would serve pages here

    def verify(self, task: Task, prediction: str) -> Verdict:
        correct = (prediction or "").strip().lower() == task.answer.lower()
        return Verdict(correct=correct, score=float(correct))

    def oracle(self, task: Task, tools: dict[str, Any]) -> OracleRun:
        """Solves a task through the tools only: search the country, read the capital off the entry."""
        country = re.search(r"capital of (\w+)", task.question).group(1)
        result = tools["search"]({"queries": [country]})
        steps = [("search", {"queries": [country]}, result.ok, result.latency_s)]
        match = re.search(rf"^{country}: capital (\w+)$", result.text, re.MULTILINE)
        return OracleRun(match.group(1) if match else "", steps)
