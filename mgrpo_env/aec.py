"""The M-GRPO hierarchy as a PettingZoo AEC environment.

Description:
    A main agent (``main_0``) answers a research question. It may call ``delegate(task, context)``;
    each call creates a fresh sub-agent (``sub_0``, ``sub_1``, ...; a finished agent never comes back)
    which becomes the selected agent and works turn by turn with ``search``, ``visit`` and ``click``
    until it writes ``<result>``. The result returns to the main agent as the tool response of its
    delegate call. ``<answer>`` ends the episode. Agents act at different frequencies: the main agent
    waits while a sub-agent works, which is why this is an AEC and not a parallel env.

Action space:
    :class:`mgrpo_env.spaces.ProtocolText`: the agent's text for one turn (docs/design.md protocol).

Observation space:
    ``Dict({"text": Text})``: what the agent must read next (the question or subtask at the start,
    then a ``<tool_response>``). The whole chat is ``infos[agent]["messages"]`` (system prompt
    included), ready for a chat template.

Rewards:
    Paid when the episode ends (0 before). ``main_0``: R_M = a1*r_format + a2*r_correct if its format
    was valid, else 0. Each sub-agent: R_S = b1*r_format + b2*r_correct(main) + b3*r_expert if valid,
    else 0. Components are in ``infos[agent]["reward_components"]``.

Starting state:
    ``reset(seed=, options=)`` picks a task of the split with ``self.np_random`` (or
    ``options={"task_id": ...}`` / ``options={"task": Task}``). Only ``main_0`` is alive.

Episode end:
    Termination when the main agent answers. Truncation when it reaches ``max_main_turns``. A
    sub-agent reaching ``max_sub_turns`` stops, and the main agent is told. A sub-agent that has
    reported stays in ``agents`` (not selected) until the episode ends, so it can be paid.

Arguments:
    scenario (name or Scenario), split, seed (used by the first ``reset`` without one),
    scenario_kwargs, world (an open world to share; else the scenario's own is opened lazily and
    closed by ``close``), tasks (override the split), limits / the Limits fields as keywords,
    rewards (RewardConfig), render_mode ("ansi" or "human"), tools (role -> tool names: the run's
    choice of each role's tools, checked by ``protocol.check_tool_names``; default the scenario's).

Implementation:
    A thin adapter: the episode (reset, seeding, the turn loop, limits, pay) is
    :class:`mgrpo_env.episode_core.Episode`; this class keeps PettingZoo's tables in step with it.

Version history:
    v0: first release.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pettingzoo import AECEnv
from pettingzoo.utils import wrappers

from mgrpo_scenarios import Scenario, Task

from .core import Limits, RewardConfig
from .episode import AgentTrajectory, EpisodeRecord, Turn
from .episode_core import Episode, render_line, show
from .protocol import require_text
from .roles import called_roles, env_roles
from .spaces import action_space, observation_space

__all__ = ["MGRPOEnv", "env", "raw_env"]

MAIN = "main_0"


class MGRPOEnv(AECEnv):
    metadata = {"name": "mgrpo_v0", "render_modes": ["ansi", "human"], "is_parallelizable": False}

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
        rewards: RewardConfig | None = None,
        render_mode: str | None = None,
        tools: Mapping[str, Sequence[str]] | None = None,
        **limit_kwargs: Any,
    ) -> None:
        super().__init__()
        if limits is not None and limit_kwargs:
            raise ValueError("pass either limits=Limits(...) or limit keywords, not both")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']}, got {render_mode!r}")
        self.render_mode = render_mode
        limits = limits or Limits(**limit_kwargs)
        # every role of the hierarchy (a registered one included): the main agent, then each called role's agents
        called = called_roles(env_roles("hierarchy"))
        role_of = {MAIN: "main", **{f"{role}_{i}": role for role in called for i in range(limits.max_delegations)}}
        self.possible_agents = list(role_of)
        obs_space = observation_space(limits.max_observation_chars)
        spaces = {role: action_space(limits.max_action_chars, role) for role in ("main", *called)}
        self.observation_spaces = {a: obs_space for a in self.possible_agents}
        self.action_spaces = {a: spaces[role] for a, role in role_of.items()}
        # sub-agents' spaces are not reached by seed_test's seeding (they are not alive at reset): the
        # episode seeds them all from its np_random
        self.core = Episode("hierarchy", scenario, split, seed=seed, scenario_kwargs=scenario_kwargs, world=world,
                            tasks=tasks, limits=limits, rewards=rewards, tools=tools,
                            on_observation=self._observed, seed_spaces=list(self.action_spaces.values()))
        self.scenario, self.split, self.limits, self.reward_config = (self.core.scenario, self.core.split,
                                                                      self.core.limits, self.core.reward_config)

    # -- PettingZoo API -------------------------------------------------------------------------

    def observation_space(self, agent: str) -> Any:
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> Any:
        return self.action_spaces[agent]

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        self.agents = []
        self.rewards, self._cumulative_rewards, self.terminations, self.truncations = {}, {}, {}, {}
        self.infos = {}
        self.core.reset(seed, options)
        self.np_random, self.np_random_seed = self.core.np_random, self.core.np_random_seed
        self.agent_selection = MAIN

    def _observed(self, agent: str) -> None:
        """The episode changed ``agent``'s observation: a new agent joins the tables; its info is current."""
        if agent not in self.rewards:
            self.agents.append(agent)
            for table, value in ((self.rewards, 0.0), (self._cumulative_rewards, 0.0), (self.terminations, False),
                                 (self.truncations, False)):
                table[agent] = value
        traj = self.core.agents[agent].traj
        self.infos[agent] = {"role": traj.role, "turn": len(traj.turns), "task_id": self.core.task.id,
                             "messages": traj.messages}

    def observe(self, agent: str) -> dict[str, str]:
        return {"text": self.core.agents[agent].observation}

    def step(self, action: str | None) -> None:
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        self._cumulative_rewards[agent] = 0.0
        self.core.act(require_text(action, agent))
        if self.core.finished:
            self._paid()
        else:
            self.agent_selection = self.core.selected.name
        self._accumulate_rewards()
        if self.render_mode == "human":
            self.render()

    def _paid(self) -> None:
        """The episode ended: every agent gets its reward and is done."""
        record = self.core.record
        done = self.truncations if record.final_answer is None else self.terminations
        for agent in self.agents:
            self.rewards[agent] = record.components[agent]["reward"]
            done[agent] = True
            self.infos[agent] = {**self.infos.get(agent, {}), "reward_components": record.components[agent],
                                 "end_reason": record.end_reason}
        self.agent_selection = self.agents[0]

    def render(self) -> str | None:
        """The selected agent's last turn as one line: returned for ``render_mode="ansi"``, printed
        (and None returned) for ``"human"``, as PettingZoo's ``render_test`` requires; None without a
        render mode."""
        if self.render_mode is None:
            return None
        agent = self.core.agents.get(self.agent_selection)
        return show(self.render_mode, render_line(self.agent_selection, agent and agent.traj,
                                                  agent.observation if agent else ""))

    def close(self) -> None:
        self.core.close()

    @property
    def record(self) -> EpisodeRecord | None:
        """The current episode's record."""
        return self.core.record

    @property
    def task(self) -> Task:
        """The current episode's task."""
        return self.core.task

    def trajectory(self, agent: str) -> AgentTrajectory:
        """``agent``'s trajectory in the current episode (turns, messages, flags)."""
        return self.core.agents[agent].traj

    def last_turn(self, agent: str) -> Turn:
        """The latest turn of ``agent`` in this episode (to attach policy extras such as token ids)."""
        return self.core.agents[agent].traj.turns[-1]


def raw_env(**kwargs: Any) -> MGRPOEnv:
    """The bare environment, without PettingZoo's order-enforcing wrapper."""
    return MGRPOEnv(**kwargs)


def env(scenario: str | Scenario = "wiki-hops", split: str = "stage2", seed: int | None = None, **kwargs: Any) -> Any:
    """``mgrpo_env.env(scenario="wiki-hops", split="stage2", seed=0)``: the AEC env, wrapped.

    The wrapper enforces PettingZoo's call order (reset before step, ...). The bare env is
    ``.unwrapped``; its ``record`` is the current episode's :class:`EpisodeRecord`.
    """
    return wrappers.OrderEnforcingWrapper(MGRPOEnv(scenario, split, seed=seed, **kwargs))
