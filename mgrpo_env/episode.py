"""Episode records: everything an episode did, in one JSON-serialisable object.

An :class:`EpisodeRecord` holds the main agent's trajectory, one :class:`AgentTrajectory` per
sub-agent call (task, context, turns, result), every tool call with its latency and outcome, the
format flags, the final answer and the reward components. Records round-trip through JSONL
(``write_jsonl`` / ``read_jsonl``) without loss; policy extras attached to a turn (sampled token ids,
log-probabilities) are kept as they are.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["ToolCall", "Turn", "AgentTrajectory", "EpisodeRecord", "write_jsonl", "read_jsonl"]


@dataclass
class ToolCall:
    """One tool call: its arguments, outcome (``ok``/``error``), latency and details (URL, cache hit...)."""

    tool: str
    arguments: dict[str, Any]
    ok: bool
    error: str | None = None
    latency_s: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class Turn:
    """One action of an agent and what came back.

    Attributes:
        action: the agent's raw text.
        kind: "tool_call", "answer", "result" or "error" (malformed; see ``error_kind``).
        observation: the text the agent read next (tool response or error), "" for a final turn.
        tool_call: the tool call this turn made, if any.
        extra: what the policy attached (e.g. ``token_ids``, ``logprobs``); kept verbatim.
    """

    action: str
    kind: str
    observation: str = ""
    error_kind: str | None = None
    tool_call: ToolCall | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class AgentTrajectory:
    """One agent's whole trajectory. For a sub-agent, ``task``/``context`` are what the main agent
    delegated and ``final`` is its ``<result>``; for the main agent ``final`` is its ``<answer>``.

    ``messages`` is the chat the agent saw (system, user, assistant, user(tool_response), ...), in
    the order a chat template renders it.
    """

    agent: str
    role: str
    messages: list[dict[str, str]] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    final: str | None = None
    format_errors: int = 0
    truncated: bool = False
    task: str | None = None
    context: str | None = None
    format_ok: bool = False
    expert: float | None = None
    reward: float = 0.0

    @property
    def tool_calls(self) -> list[ToolCall]:
        return [t.tool_call for t in self.turns if t.tool_call is not None]


@dataclass
class EpisodeRecord:
    """A whole episode. ``rewards`` maps agent name to its reward; ``components`` keeps the parts."""

    episode_id: str
    task: dict[str, Any]
    seed: int | None = None
    main: AgentTrajectory | None = None
    subs: list[AgentTrajectory] = field(default_factory=list)
    final_answer: str | None = None
    correct: bool = False
    score: float = 0.0
    truncated: bool = False
    end_reason: str = ""
    rewards: dict[str, float] = field(default_factory=dict)
    components: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0
    tool_s: float = 0.0

    @property
    def num_subs(self) -> int:
        return len(self.subs)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EpisodeRecord:
        data = dict(data)
        data["main"] = _trajectory(data["main"]) if data.get("main") else None
        data["subs"] = [_trajectory(s) for s in data.get("subs", [])]
        return cls(**data)


def _trajectory(data: dict[str, Any]) -> AgentTrajectory:
    data = dict(data)
    turns = []
    for t in data.pop("turns", []):
        t = dict(t)
        if t.get("tool_call") is not None:
            t["tool_call"] = ToolCall(**t["tool_call"])
        turns.append(Turn(**t))
    return AgentTrajectory(turns=turns, **data)


def write_jsonl(path: str | Path, records: Iterable[EpisodeRecord], *, append: bool = False) -> int:
    """Write one record per line; returns how many were written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with path.open("a" if append else "w", encoding="utf-8") as fh:
        for record in records:
            fh.write(json.dumps(record.to_dict(), ensure_ascii=False) + "\n")
            n += 1
    return n


def read_jsonl(path: str | Path) -> Iterator[EpisodeRecord]:
    """Read records back. A malformed line raises ValueError naming the file and line number."""
    with Path(path).open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                yield EpisodeRecord.from_dict(json.loads(line))
            except (json.JSONDecodeError, TypeError, KeyError) as exc:
                raise ValueError(f"{path}:{lineno}: not an episode record ({exc})") from exc
