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

Implementation:
    A thin adapter over :class:`mgrpo_env.episode_core.Episode` (reset, seeding, the turn loop,
    the limit, the pay), which the AEC env and the batched collection run too.

Version history:
    v0: first release.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym

from mgrpo_scenarios import Scenario, Task

from .core import Limits, RewardConfig
from .episode import EpisodeRecord
from .episode_core import Episode, render_line, show
from .protocol import require_text
from .spaces import action_space, observation_space

__all__ = ["SingleAgentEnv", "single_agent_env"]

AGENT = "single_0"


class SingleAgentEnv(gym.Env):
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
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']}, got {render_mode!r}")
        self.render_mode = render_mode
        # the hierarchy's Limits object: its single_agent_turns and character limits; keywords override
        self.core = Episode("single", scenario, split, seed=seed, scenario_kwargs=scenario_kwargs, world=world,
                            tasks=tasks, limits=limits, rewards=rewards, tools=tools, max_turns=max_turns,
                            max_action_chars=max_action_chars, max_observation_chars=max_observation_chars)
        core = self.core
        self.scenario, self.split, self.limits, self.reward_config = core.scenario, core.split, core.limits, core.reward_config
        self.max_turns, self.max_action_chars, self.max_observation_chars = (core.max_turns, core.max_action_chars,
                                                                             core.max_observation_chars)
        self.observation_space = observation_space(self.max_observation_chars)
        self.action_space = action_space(self.max_action_chars, "single")

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict[str, str], dict[str, Any]]:
        self.core.reset(seed, options)
        self._np_random, self._np_random_seed = self.core.np_random, self.core.np_random_seed
        if self.render_mode == "human":
            self.render()
        return self._observation(), self._info()

    def _observation(self) -> dict[str, str]:
        return {"text": self.core.agents[AGENT].observation}

    def _info(self, **extra: Any) -> dict[str, Any]:
        traj = self.core.record.main
        return {"task_id": self.core.task.id, "turn": len(traj.turns), "messages": traj.messages, **extra}

    def step(self, action: str) -> tuple[dict[str, str], float, bool, bool, dict[str, Any]]:
        self.core.act(require_text(action, "the single agent"))
        if self.core.finished:
            record = self.core.record
            terminated = record.end_reason == "answer"
            out = (self._observation(), record.main.reward, terminated, not terminated,
                   self._info(reward_components=record.components[AGENT]))
        else:
            out = (self._observation(), 0.0, False, False, self._info())
        if self.render_mode == "human":
            self.render()
        return out

    @property
    def record(self) -> EpisodeRecord | None:
        """The current episode's record (its ``main`` is the single agent's trajectory)."""
        return self.core.record

    @property
    def task(self) -> Task:
        """The current episode's task."""
        return self.core.task

    def render(self) -> str | None:
        """The last turn as one line: returned for ``render_mode="ansi"``, printed (and None returned)
        for ``"human"`` (which ``reset`` and ``step`` also do by themselves); None otherwise."""
        if self.render_mode is None:
            return None
        return show(self.render_mode, render_line(AGENT, self.core.record.main, self.core.agents[AGENT].observation))

    def close(self) -> None:
        self.core.close()


def single_agent_env(scenario: str | Scenario = "wiki-hops", split: str = "stage2", **kwargs: Any) -> SingleAgentEnv:
    """``mgrpo_env.single_agent_env(scenario="wiki-hops", split="stage2")``: the Gymnasium env."""
    return SingleAgentEnv(scenario, split, **kwargs)
