"""Episode records: everything an episode did, in one JSON-serialisable object.

An :class:`EpisodeRecord` holds the main agent's trajectory, one :class:`AgentTrajectory` per
sub-agent call (task, context, turns, result), every tool call with its latency and outcome, the
format flags, the final answer and the reward components. Records round-trip through JSONL
(``write_jsonl`` / ``read_jsonl``) without loss; policy extras attached to a turn (sampled token ids,
log-probabilities) are kept as they are, except for one lossless change of form.

Token ids, stored linearly: in memory a token-tracking policy's turn holds its whole prompt
(``prompt_ids``), and one agent's prompts nest (turn t+1's prompt is turn t's prompt + completion +
the tokenised tool response), so writing them as they are repeats the whole history every turn
(quadratic in turns). :func:`compact_token_extras` writes a turn whose prompt starts with the
previous turn's ``prompt_ids + completion_ids`` as::

    {"prompt_shared": n, "prompt_new_ids": [...], "completion_ids": [...], "logprobs": [...], ...}

(n = the length of that prefix, kept as a check; ``prompt_new_ids`` = the rest of the prompt). The
first turn, a turn after one without ids, and a turn whose prompt does not nest keep ``prompt_ids``.
:meth:`EpisodeRecord.to_dict` (hence ``write_jsonl``) compacts each agent's turns and
:meth:`EpisodeRecord.from_dict` (hence ``read_jsonl``) expands them with
:func:`expand_token_extras`, so a record reads back equal to the one written; files with full
``prompt_ids`` everywhere (written before this form existed) read as they are.
:func:`mgrpo_algo.core.sequences.trajectory_sequence` accepts either form.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from . import strict_json

__all__ = [
    "ToolCall", "Turn", "AgentTrajectory", "EpisodeRecord", "write_jsonl", "read_jsonl",
    "compact_token_extras", "expand_token_extras",
]

#: Keys of the compact form of a turn's prompt (see the module docstring).
SHARED, NEW_IDS = "prompt_shared", "prompt_new_ids"


def _full_prompt(extra: Mapping[str, Any], previous: list[int] | None, index: int) -> list[int] | None:
    """The whole prompt of a turn in either form (None: the turn has no prompt ids).

    ``previous`` is the previous turn's ``prompt_ids + completion_ids`` (None if it had no ids).
    """
    if SHARED in extra:
        shared = extra[SHARED]
        # The length is redundant with ``previous``; checking it catches reordered, dropped or
        # hand-edited turns, which would otherwise expand silently into wrong prompts.
        if previous is None or shared != len(previous):
            have = "no ids" if previous is None else f"{len(previous)} ids"
            raise ValueError(f"turn {index} shares {shared} prompt ids with the previous turn, which has {have}")
        return previous + list(extra[NEW_IDS])
    prompt = extra.get("prompt_ids")
    return None if prompt is None else list(prompt)


def _next_prefix(prompt: list[int] | None, extra: Mapping[str, Any]) -> list[int] | None:
    """What the next turn's prompt must start with to be stored compact: this prompt + completion."""
    completion = extra.get("completion_ids")
    return None if prompt is None or completion is None else prompt + list(completion)


def _replace_key(extra: Mapping[str, Any], old: str, new: dict[str, Any], drop: tuple[str, ...] = ()) -> dict[str, Any]:
    """A copy of ``extra`` with ``old`` replaced in place (same key order, so JSON reads the same) by
    the items of ``new``, and the keys in ``drop`` removed."""
    out: dict[str, Any] = {}
    for key, value in extra.items():
        if key == old:
            out.update(new)
        elif key not in drop:
            out[key] = value
    return out


def compact_token_extras(extras: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One agent's turn extras, oldest first, with each nesting prompt stored as its new ids only.

    A turn whose ``prompt_ids`` start with the previous turn's ``prompt_ids + completion_ids`` becomes
    ``{"prompt_shared": n, "prompt_new_ids": rest}``; other turns are copied as they are. Inputs are
    not modified (shallow copies); turns already compact are kept, so compacting twice is harmless.

    Raises:
        ValueError: a compact turn whose shared length does not match the previous turn.
    """
    out: list[dict[str, Any]] = []
    for extra, prompt, previous in _turn_prompts(extras):
        if SHARED not in extra and prompt is not None and previous is not None and prompt[: len(previous)] == previous:
            out.append(_replace_key(extra, "prompt_ids", {SHARED: len(previous), NEW_IDS: prompt[len(previous):]}))
        else:
            out.append(dict(extra))
    return out


def expand_token_extras(extras: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The inverse of :func:`compact_token_extras`: every turn with prompt ids gets its whole
    ``prompt_ids`` back (turns already full are copied as they are, so old files expand to themselves).

    Raises:
        ValueError: a compact turn whose shared length does not match the previous turn.
    """
    return [_replace_key(extra, SHARED, {"prompt_ids": prompt}, drop=(NEW_IDS,)) if SHARED in extra else dict(extra)
            for extra, prompt, _ in _turn_prompts(extras)]


def _turn_prompts(extras: Sequence[Mapping[str, Any]]) -> Iterator[tuple[Mapping[str, Any], list[int] | None, list[int] | None]]:
    """(extra, its whole prompt ids, the previous turn's prompt + completion) for each turn, oldest first."""
    previous: list[int] | None = None
    for i, extra in enumerate(extras):
        prompt = _full_prompt(extra, previous, i)
        yield extra, prompt, previous
        previous = _next_prefix(prompt, extra)


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
        extra: what the policy attached (e.g. ``prompt_ids``, ``completion_ids``, ``logprobs``); kept
            verbatim in memory (the whole prompt), written compact (see the module docstring).
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
    """A whole episode. ``rewards`` maps agent name to its reward; ``components`` keeps the parts.

    ``trajectory_key``: where a trainer's role workers keep this episode's sampled token ids
    (``{"iteration": t, "index": i}``: agent a's turns are ``"<i>/<a>"`` of iteration t in its role
    worker's trajectories); None when the policies' token ids are on the turns (``Turn.extra``).
    """

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
    trajectory_key: dict[str, int] | None = None

    @property
    def num_subs(self) -> int:
        return len(self.subs)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; each agent's token ids in the compact form (linear in turns)."""
        # Compact before ``asdict``, which deep-copies: copying the full prompts would be quadratic.
        main = _compacted(self.main) if self.main is not None else None
        return asdict(replace(self, main=main, subs=[_compacted(s) for s in self.subs]))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EpisodeRecord:
        """The record of :meth:`to_dict` (compact or full token ids: both read back full)."""
        data = dict(data)
        data["main"] = _trajectory(data["main"]) if data.get("main") else None
        data["subs"] = [_trajectory(s) for s in data.get("subs", [])]
        return cls(**data)


def _compacted(trajectory: AgentTrajectory) -> AgentTrajectory:
    """A shallow copy of ``trajectory`` whose turns carry compact extras."""
    extras = compact_token_extras([t.extra for t in trajectory.turns])
    return replace(trajectory, turns=[replace(t, extra=e) for t, e in zip(trajectory.turns, extras, strict=True)])


def _trajectory(data: dict[str, Any]) -> AgentTrajectory:
    data = dict(data)
    raw = data.pop("turns", [])
    extras = expand_token_extras([t.get("extra", {}) for t in raw])
    turns = []
    for t, extra in zip(raw, extras, strict=True):
        t = {**t, "extra": extra}
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
            fh.write(strict_json.dumps(record.to_dict(), ensure_ascii=False) + "\n")
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
            except (ValueError, TypeError, KeyError) as exc:  # ValueError covers JSONDecodeError
                raise ValueError(f"{path}:{lineno}: not an episode record ({exc})") from exc
