"""The single-agent baseline as a Gymnasium environment.

Description:
    One agent holds all of the sub-agent's tools (``search``, ``visit``, ``click``) and answers the
    question itself with ``<answer>``: the single-agent GRPO baseline of the paper.

Action space:
    :class:`mgrpo_env.spaces.ProtocolText` (role "single"): the agent's text for one turn.

Observation space:
    ``Dict({"text": Text})``: the question at reset, then each ``<tool_response>``. The whole chat is
    ``info["messages"]``.

Rewards:
    At the end only: R = a1*r_format + a2*r_correct if the format was valid, else 0 (the main agent's
    formula, docs/design.md). Components in ``info["reward_components"]``.

Starting state:
    ``reset(seed=, options=)`` picks a task with ``self.np_random`` (or ``options["task_id"]`` /
    ``options["task"]``).

Episode end:
    Terminated on ``<answer>``; truncated after ``max_turns`` actions.

Arguments:
    scenario, split, seed, scenario_kwargs, world, tasks, limits (the AEC env's :class:`Limits`: the
    turn budget is its ``single_agent_turns``, main x sub turns, 48 by default), max_turns,
    max_action_chars, max_observation_chars (override the limits), rewards (a :class:`RewardConfig`
    as the hierarchy takes; its ``main_weights``, the paper's (0.1, 0.9) by default), render_mode ("ansi": ``render()`` returns the
    last turn as text; "human": it is printed after every reset and step), tools (``{"single": names}``:
    the run's choice of the agent's tools; default the scenario's).

Registration:
    ``gymnasium.make("mgrpo/WikiHops-v0", **kwargs)`` (registered on ``import mgrpo_env``) builds this
    env on the ``wiki-hops`` scenario; ``scenario=`` names another.

Version history:
    v0: first release.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym

from mgrpo_scenarios import Scenario, Task

from .core import (
    Limits,
    RewardConfig,
    pick_task,
)
from .episode import AgentTrajectory, EpisodeRecord
from .episode_core import (
    EpisodeSource,
    close_record,
    pay_answer,
    record_turn,
    render_line,
    reply,
    run_tool,
    show,
)
from .protocol import (
    format_error,
    parse_action,
    require_text,
    role_tools,
    system_prompt,
)
from .spaces import action_space, observation_space, sanitize

__all__ = ["SingleAgentEnv", "single_agent_env"]


class SingleAgentEnv(EpisodeSource, gym.Env):
    metadata = {"render_modes": ["ansi", "human"], "render_fps": 4}

    def __init__(
        self,
        scenario: str | Scenario = "wiki-hops",
        split: str = "stage2",
        *,
        seed: int | None = None,
        scenario_kwargs: dict[str, Any] | None = None,
        world: Any | None = None,
        tasks: Sequence[Task] | None = None,
        limits: Limits | None = None,
        max_turns: int | None = None,
        max_action_chars: int | None = None,
        max_observation_chars: int | None = None,
        rewards: RewardConfig | None = None,
        render_mode: str | None = None,
        tools: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        # the hierarchy's Limits object: its single_agent_turns and character limits; keywords override
        self.limits = limits if limits is not None else Limits()
        max_turns = self.limits.single_agent_turns if max_turns is None else max_turns
        max_action_chars = self.limits.max_action_chars if max_action_chars is None else max_action_chars
        max_observation_chars = self.limits.max_observation_chars if max_observation_chars is None else max_observation_chars
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self._setup_episodes(scenario, split, seed=seed, scenario_kwargs=scenario_kwargs, world=world, tasks=tasks,
                       render_mode=render_mode)
        self.max_turns = max_turns
        self.max_action_chars = max_action_chars
        self.max_observation_chars = max_observation_chars
        self.reward_config = rewards or RewardConfig()
        self.observation_space = observation_space(max_observation_chars)
        self.action_space = action_space(max_action_chars, "single")
        # the run's choice (``tools["single"]``), else the scenario's set (default: the sub-agent's)
        self._tools_spec = role_tools(self.scenario, "single", (tools or {}).get("single"))
        self._prompt = system_prompt("single", self._tools_spec, getattr(self.scenario, "prompt_style", "full"))
        self.record: EpisodeRecord | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict[str, str], dict[str, Any]]:
        if seed is None and not self._seeded:
            seed = self._default_seed
        super().reset(seed=seed)
        self._seeded = True
        self._task = pick_task(self._tasks, self.np_random, options or {}, self.split)
        self._traj = AgentTrajectory(agent="single_0", role="single")
        self._traj.messages += [{"role": "system", "content": self._prompt}, {"role": "user", "content": self._task.question}]
        self._tools = self._world.make_tools()
        self.record = EpisodeRecord(episode_id=uuid.uuid4().hex[:12], task=self._task.to_dict(), seed=seed, main=self._traj)
        self._started = time.perf_counter()
        self._obs = sanitize(self._task.question, self.max_observation_chars)
        if self.render_mode == "human":
            self.render()
        return {"text": self._obs}, self._info()

    def _info(self, **extra: Any) -> dict[str, Any]:
        return {"task_id": self._task.id, "turn": len(self._traj.turns), "messages": self._traj.messages, **extra}

    def step(self, action: str) -> tuple[dict[str, str], float, bool, bool, dict[str, Any]]:
        out = self._step(action)
        if self.render_mode == "human":
            self.render()
        return out

    def _step(self, action: str) -> tuple[dict[str, str], float, bool, bool, dict[str, Any]]:
        text = require_text(action, "the single agent")
        traj = self._traj
        parsed = parse_action(text, role="single", allowed_tools=self._tools_spec, max_chars=self.max_action_chars)
        turn = record_turn(traj, text, parsed)
        if parsed.kind == "answer":
            traj.final = parsed.content
            return {"text": self._obs}, *self._finish(terminated=True)
        if not parsed.ok:
            traj.format_errors += 1
            observation = format_error(parsed)
        else:
            observation = run_tool(self.record, self._tools, parsed, turn)
        reply(traj, turn, observation)
        self._obs = sanitize(observation, self.max_observation_chars)
        if len(traj.turns) >= self.max_turns:
            traj.truncated = True
            return {"text": self._obs}, *self._finish(terminated=False)
        return {"text": self._obs}, 0.0, False, False, self._info()

    def _finish(self, terminated: bool) -> tuple[float, bool, bool, dict[str, Any]]:
        traj = self._traj
        verdict, correct, components = pay_answer(self.scenario, self._task, traj, self.reward_config.main_weights)
        close_record(self.record, traj.final, verdict, correct, truncated=not terminated,
                     end_reason="answer" if terminated else "turn_limit", components={traj.agent: components},
                     started=self._started)
        return traj.reward, terminated, not terminated, self._info(reward_components=components)

    @property
    def task(self) -> Task:
        """The current episode's task."""
        return self._task

    def render(self) -> str | None:
        """The last turn as one line: returned for ``render_mode="ansi"``, printed (and None returned)
        for ``"human"`` (which ``reset`` and ``step`` also do by themselves); None otherwise."""
        if self.render_mode is None:
            return None
        return show(self.render_mode, render_line("single_0", self._traj, self._obs))

    def close(self) -> None:
        self._world.close()


def single_agent_env(scenario: str | Scenario = "wiki-hops", split: str = "stage2", **kwargs: Any) -> SingleAgentEnv:
    """``mgrpo_env.single_agent_env(scenario="wiki-hops", split="stage2")``: the Gymnasium env."""
    return SingleAgentEnv(scenario, split, **kwargs)
