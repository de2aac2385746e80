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

Version history:
    v0: first release.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from gymnasium.utils import seeding
from pettingzoo import AECEnv
from pettingzoo.utils import wrappers

from mgrpo_scenarios import Scenario, Task

from . import rewards as reward_fns
from .core import (
    Limits,
    RewardConfig,
    pick_task,
)
from .episode import AgentTrajectory, EpisodeRecord, ToolCall, Turn
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
    format_tool_response,
    parse_action,
    require_text,
    role_tools,
    system_prompt,
)
from .roles import env_roles
from .spaces import action_space, observation_space, sanitize

__all__ = ["MGRPOEnv", "env", "raw_env"]

MAIN = "main_0"


class MGRPOEnv(EpisodeSource, AECEnv):
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
        self.limits = limits or Limits(**limit_kwargs)
        self.reward_config = rewards or RewardConfig()
        self._setup_episodes(scenario, split, seed=seed, scenario_kwargs=scenario_kwargs, world=world, tasks=tasks,
                       render_mode=render_mode)

        self.possible_agents = [MAIN] + [f"sub_{i}" for i in range(self.limits.max_delegations)]
        obs_space = observation_space(self.limits.max_observation_chars)
        main_space = action_space(self.limits.max_action_chars, "main")
        sub_space = action_space(self.limits.max_action_chars, "sub")
        self.observation_spaces = {a: obs_space for a in self.possible_agents}
        self.action_spaces = {a: (main_space if a == MAIN else sub_space) for a in self.possible_agents}
        style = getattr(self.scenario, "prompt_style", "full")  # a scenario's profile may ask for compact prompts
        # each role's tool set: the run's choice (``tools``: role -> names), else the scenario's
        self._tools_of = {role: role_tools(self.scenario, role, (tools or {}).get(role)) for role in env_roles("hierarchy")}
        self._prompts = {role: system_prompt(role, specs, style) for role, specs in self._tools_of.items()}
        self.record: EpisodeRecord | None = None

    # -- PettingZoo API -------------------------------------------------------------------------

    def observation_space(self, agent: str) -> Any:
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> Any:
        return self.action_spaces[agent]

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        if seed is None and not self._seeded:
            seed = self._default_seed
        if seed is not None or not self._seeded:
            self.np_random, self.np_random_seed = seeding.np_random(seed)
            self._seeded = True
            # sub-agents' spaces are not reached by seed_test's seeding (they are not alive at reset)
            for space in {id(s): s for s in self.action_spaces.values()}.values():
                space.seed(int(self.np_random.integers(2**31)))
        self._task = pick_task(self._tasks, self.np_random, options or {}, self.split)
        self.agents = [MAIN]
        self.rewards = {MAIN: 0.0}
        self._cumulative_rewards = {MAIN: 0.0}
        self.terminations = {MAIN: False}
        self.truncations = {MAIN: False}
        self._trajectories: dict[str, AgentTrajectory] = {}
        self._tools: dict[str, dict[str, Any]] = {}
        self._observations: dict[str, str] = {}
        self.infos = {}
        self.record = EpisodeRecord(
            episode_id=uuid.uuid4().hex[:12], task=self._task.to_dict(), seed=seed
        )
        self._started = time.perf_counter()
        main = self._start_agent(MAIN, "main", self._task.question)
        self.record.main = main
        self.agent_selection = MAIN

    def observe(self, agent: str) -> dict[str, str]:
        return {"text": self._observations[agent]}

    def step(self, action: str | None) -> None:
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        self._cumulative_rewards[agent] = 0.0
        text = require_text(action, agent)
        if agent == MAIN:
            self._step_main(text)
        else:
            self._step_sub(agent, text)
        self._accumulate_rewards()
        if self.render_mode == "human":
            self.render()

    def render(self) -> str | None:
        """The selected agent's last turn as one line: returned for ``render_mode="ansi"``, printed
        (and None returned) for ``"human"``, as PettingZoo's ``render_test`` requires; None without a
        render mode."""
        if self.render_mode is None:
            return None
        agent = self.agent_selection
        return show(self.render_mode, render_line(agent, self._trajectories.get(agent), self._observations.get(agent, "")))

    def close(self) -> None:
        self._world.close()

    @property
    def task(self) -> Task:
        """The current episode's task."""
        return self._task

    def trajectory(self, agent: str) -> AgentTrajectory:
        """``agent``'s trajectory in the current episode (turns, messages, flags)."""
        return self._trajectories[agent]

    def last_turn(self, agent: str) -> Turn:
        """The latest turn of ``agent`` in this episode (to attach policy extras such as token ids)."""
        return self._trajectories[agent].turns[-1]

    # -- the hierarchy --------------------------------------------------------------------------

    def _start_agent(self, agent: str, role: str, first_message: str, task: str | None = None, context: str | None = None) -> AgentTrajectory:
        traj = AgentTrajectory(agent=agent, role=role, task=task, context=context)
        traj.messages.append({"role": "system", "content": self._prompts[role]})
        traj.messages.append({"role": "user", "content": first_message})
        self._trajectories[agent] = traj
        self._set_observation(agent, first_message)
        return traj

    def _set_observation(self, agent: str, text: str) -> None:
        self._observations[agent] = sanitize(text, self.limits.max_observation_chars)
        traj = self._trajectories[agent]
        self.infos[agent] = {
            "role": traj.role,
            "turn": len(traj.turns),
            "task_id": self._task.id,
            "messages": traj.messages,
        }

    def _reply(self, agent: str, turn: Turn, observation: str) -> None:
        """Give ``agent`` its next observation (also appended to its chat)."""
        reply(self._trajectories[agent], turn, observation)
        self._set_observation(agent, observation)

    def _step_main(self, text: str) -> None:
        traj = self._trajectories[MAIN]
        parsed = parse_action(text, role="main", allowed_tools=self._tools_of["main"], max_chars=self.limits.max_action_chars)
        turn = record_turn(traj, text, parsed)
        if not parsed.ok:
            traj.format_errors += 1
            self._reply(MAIN, turn, format_error(parsed))
        elif parsed.kind == "answer":
            traj.final = parsed.content
            self._finish(end_reason="answer")
            return
        elif parsed.tool_name == "delegate":
            n = len(self.record.subs)
            if n >= self.limits.max_delegations:
                error = f"limit: all {self.limits.max_delegations} delegations of this episode are used; answer now."
                turn.tool_call = ToolCall("delegate", dict(parsed.arguments), ok=False, error=error)
                self._reply(MAIN, turn, format_tool_response(f"Error (delegate): {error}"))
            else:
                self._delegate(turn, n, str(parsed.arguments.get("task", "")), parsed.arguments.get("context"))
                return
        else:  # a tool the main agent may name but that this env does not run (e.g. reason without a reasoner)
            self._reply(MAIN, turn, run_tool(self.record, {}, parsed, turn))
        if len(traj.turns) >= self.limits.max_main_turns:
            traj.truncated = True
            self._finish(end_reason="main_turn_limit")

    def _delegate(self, turn: Turn, n: int, task: str, context: Any) -> None:
        name = f"sub_{n}"
        context_text = str(context) if context is not None else None
        first = f"Subtask: {task}" + (f"\nContext: {context_text}" if context_text else "")
        sub = self._start_agent(name, "sub", first, task=task, context=context_text)
        turn.tool_call = ToolCall("delegate", {"task": task, "context": context_text}, ok=True, meta={"agent": name})
        self.record.subs.append(sub)
        self._tools[name] = self._world.make_tools()
        self.agents.append(name)
        for table, value in ((self.rewards, 0.0), (self._cumulative_rewards, 0.0), (self.terminations, False), (self.truncations, False)):
            table[name] = value
        self._pending_delegate = turn
        self.agent_selection = name

    def _step_sub(self, agent: str, text: str) -> None:
        traj = self._trajectories[agent]
        parsed = parse_action(text, role="sub", allowed_tools=self._tools_of["sub"], max_chars=self.limits.max_action_chars)
        turn = record_turn(traj, text, parsed)
        if not parsed.ok:
            traj.format_errors += 1
            self._reply(agent, turn, format_error(parsed))
        elif parsed.kind == "result":
            traj.final = parsed.content
            self._return_to_main(parsed.content)
            return
        else:
            self._reply(agent, turn, run_tool(self.record, self._tools[agent], parsed, turn))
        if len(traj.turns) >= self.limits.max_sub_turns:
            traj.truncated = True
            self._return_to_main(
                None, note=f"The sub-agent stopped at its limit of {self.limits.max_sub_turns} turns without a result."
            )

    def _return_to_main(self, result: str | None, note: str = "") -> None:
        main_turn = self._pending_delegate
        self._reply(MAIN, main_turn, format_tool_response(result if result is not None else note))
        self.agent_selection = MAIN
        main = self._trajectories[MAIN]
        if len(main.turns) >= self.limits.max_main_turns:
            main.truncated = True
            self._finish(end_reason="main_turn_limit")

    def _expert(self, sub: AgentTrajectory) -> tuple[float | None, str]:
        """(r_expert, where it came from). No report scores 0; no scorer or a scorer with nothing to
        judge by gives None, which drops the term (b3 = 0, :func:`~mgrpo_env.rewards.paid_sub_reward`)."""
        scorer = self.reward_config.expert
        if scorer is None:
            return None, "none"
        if sub.final is None:
            return 0.0, "no_result"
        value = scorer(self._task, sub.task or "", sub.final)
        if value is None:
            return None, "none"
        return float(value), getattr(scorer, "source", "custom")

    def _finish(self, end_reason: str) -> None:
        """Score the episode, pay every agent, and mark all of them done."""
        record = self.record
        main = self._trajectories[MAIN]
        answer = main.final
        verdict, correct, paid = pay_answer(self.scenario, self._task, main, self.reward_config.main_weights)
        components: dict[str, Any] = {MAIN: paid}
        for sub in record.subs:
            sub.format_ok = sub.final is not None and sub.format_errors == 0
            sub.expert, source = self._expert(sub)
            sub.reward = reward_fns.paid_sub_reward(sub.format_ok, correct, sub.expert, self.reward_config.sub_weights,
                                                    format_gate=self.reward_config.sub_format_gate)
            components[sub.agent] = {
                "format_ok": sub.format_ok, "main_correct": correct, "expert": sub.expert,
                "expert_source": source, "reward": sub.reward,
            }
        close_record(record, answer, verdict, correct, truncated=answer is None, end_reason=end_reason,
                     components=components, started=self._started)
        done = self.truncations if answer is None else self.terminations
        for agent in self.agents:
            self.rewards[agent] = components[agent]["reward"]
            done[agent] = True
            self.infos[agent] = {**self.infos.get(agent, {}), "reward_components": components[agent], "end_reason": end_reason}
        self.agent_selection = self.agents[0]


def raw_env(**kwargs: Any) -> MGRPOEnv:
    """The bare environment, without PettingZoo's order-enforcing wrapper."""
    return MGRPOEnv(**kwargs)


def env(scenario: str | Scenario = "wiki-hops", split: str = "stage2", seed: int | None = None, **kwargs: Any) -> Any:
    """``mgrpo_env.env(scenario="wiki-hops", split="stage2", seed=0)``: the AEC env, wrapped.

    The wrapper enforces PettingZoo's call order (reset before step, ...). The bare env is
    ``.unwrapped``; its ``record`` is the current episode's :class:`EpisodeRecord`.
    """
    return wrappers.OrderEnforcingWrapper(MGRPOEnv(scenario, split, seed=seed, **kwargs))
