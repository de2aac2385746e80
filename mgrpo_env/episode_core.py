"""What both envs do to an episode, written once: record a turn, run its tool call, reply, pay the
agent that answers and close the record.

The AEC env (:mod:`mgrpo_env.aec`: the hierarchy, whose sub-agents are paid there too) and the
single-agent Gymnasium env (:mod:`mgrpo_env.single`) are the turn order and the observation
plumbing of their APIs around these functions, as PettingZoo's ``raw_env`` is the logic and its
wrappers the API.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from mgrpo_scenarios import Scenario, Task

from . import rewards as reward_fns
from .core import WorldHandle, call_tool, resolve_scenario, safe_verify, split_tasks
from .episode import AgentTrajectory, EpisodeRecord, Turn
from .protocol import ParsedAction, format_tool_response

__all__ = ["EpisodeSource", "close_record", "pay_answer", "record_turn", "render_line", "reply", "run_tool", "show"]


class EpisodeSource:
    """What both envs set up alike, as a base of each (it sets only its own attributes): the render
    mode (checked against the env's ``metadata``), the scenario, its split's tasks, the shared world
    and the default seed."""

    metadata: dict[str, Any]

    def _setup_episodes(self, scenario: str | Scenario, split: str, *, seed: int | None,
                        scenario_kwargs: Mapping[str, Any] | None, world: Any | None, tasks: Any,
                        render_mode: str | None) -> None:
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']}, got {render_mode!r}")
        self.scenario = resolve_scenario(scenario, scenario_kwargs)
        self.split = split
        self.render_mode = render_mode
        self._tasks = split_tasks(self.scenario, split, tasks)
        self._world = WorldHandle(self.scenario, world)
        self._default_seed = seed
        self._seeded = False


def record_turn(traj: AgentTrajectory, text: str, parsed: ParsedAction) -> Turn:
    """Append the agent's turn (its text, the kind of action it parsed to) to its trajectory and chat."""
    turn = Turn(action=text, kind=parsed.kind, error_kind=parsed.error_kind)
    traj.turns.append(turn)
    traj.messages.append({"role": "assistant", "content": text})
    return turn


def reply(traj: AgentTrajectory, turn: Turn, observation: str) -> None:
    """What the agent reads next: the turn's observation, appended to its chat."""
    turn.observation = observation
    traj.messages.append({"role": "user", "content": observation})


def run_tool(record: EpisodeRecord, tools: Mapping[str, Any], parsed: ParsedAction, turn: Turn) -> str:
    """Run the turn's tool call against ``tools``: its record goes on the turn, its latency into the
    episode's tool time; returns the tool response the agent reads (a failure included)."""
    turn.tool_call, out = call_tool(tools, parsed)
    record.tool_s += turn.tool_call.latency_s
    return format_tool_response(out)


def pay_answer(scenario: Scenario, task: Task, traj: AgentTrajectory, weights: tuple[float, float]
               ) -> tuple[Any, bool, dict[str, Any]]:
    """Verify the answering agent's final answer and pay it R = a1*format + a2*correct (0 when its
    format was not valid): (verdict, correct, its reward components)."""
    verdict, verify_error = safe_verify(scenario, task, traj.final)
    correct = bool(verdict.correct) if verdict else False
    traj.format_ok = traj.final is not None and traj.format_errors == 0
    traj.reward = reward_fns.main_reward(traj.format_ok, correct, weights)
    components: dict[str, Any] = {"format_ok": traj.format_ok, "correct": correct, "reward": traj.reward}
    if verify_error:
        components["verify_error"] = verify_error
    return verdict, correct, components


def close_record(record: EpisodeRecord, answer: str | None, verdict: Any, correct: bool, *, truncated: bool,
                 end_reason: str, components: dict[str, dict[str, Any]], started: float) -> None:
    """The record's outcome: answer, verdict, end, every agent's reward and components, wall time."""
    record.final_answer = answer
    record.correct = correct
    record.score = float(verdict.score) if verdict else 0.0
    record.truncated = truncated
    record.end_reason = end_reason
    record.rewards = {agent: c["reward"] for agent, c in components.items()}
    record.components = components
    record.wall_s = time.perf_counter() - started


def render_line(agent: str, traj: AgentTrajectory | None, observation: str) -> str:
    """An agent's last turn as one line (its first observation before it has acted)."""
    last = traj.turns[-1] if traj is not None and traj.turns else None
    if last is None:
        return f"[{agent}] {observation[:500]}"
    return f"[{agent} turn {len(traj.turns)}] {last.action[:300]!r} -> {last.observation[:300]!r}"


def show(render_mode: str | None, text: str) -> str | None:
    """``render()``'s contract in both APIs: the text for "ansi", printed (None returned) for
    "human", None without a render mode."""
    if render_mode is None:
        return None
    if render_mode == "human":
        print(text, flush=True)
        return None
    return text
