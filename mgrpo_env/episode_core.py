"""One episode, written once: reset and seeding, the turn loop, the limits and the finish.

:class:`Episode` runs both kinds of episode (:data:`KINDS`): the hierarchy (a main agent that may
delegate to sub-agents) and the single agent. Every turn of every agent goes through one loop,
:meth:`Episode.act`: parse -> record -> format error, final action, delegation or tool -> reply ->
turn limit. The AEC env (:mod:`mgrpo_env.aec`), the single-agent Gymnasium env
(:mod:`mgrpo_env.single`) and the batched collection (:mod:`mgrpo_env.rollout`) are thin drivers of
it: the first two only translate it to their API's tables and return values, as PettingZoo's
``raw_env`` is the logic and its wrappers the API.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from gymnasium.utils import seeding

from mgrpo_scenarios import Scenario, StylesPrompts, Task

from . import rewards as reward_fns
from .core import (
    ExpertScore,
    Limits,
    RewardConfig,
    WorldHandle,
    call_tool,
    pick_task,
    resolve_scenario,
    safe_verify,
    split_tasks,
)
from .episode import AgentTrajectory, EpisodeRecord, ToolCall, Turn
from .protocol import (
    FINAL_TAGS,
    TOOL_FACTORIES,
    ParsedAction,
    format_error,
    format_tool_response,
    parse_action,
    role_tools,
    system_prompt,
)
from .roles import ROLE_TABLE, env_roles
from .spaces import sanitize

__all__ = ["KINDS", "Agent", "Episode", "EpisodeKind", "render_line", "show"]


@dataclass(frozen=True)
class EpisodeKind:
    """One kind of episode: the role that starts it and answers (its agent is ``<root>_0``), whether
    that role may delegate to sub-agents, and the end reason when the root reaches its turn limit."""

    name: str
    root: str
    delegates: bool
    limit_reason: str

    @property
    def roles(self) -> tuple[str, ...]:
        """The roles that act in this kind of episode (:func:`mgrpo_env.roles.env_roles`)."""
        return env_roles(self.name)


#: Every kind of episode by name (the ``env`` of a role in :data:`mgrpo_env.roles.ROLE_TABLE`).
KINDS: dict[str, EpisodeKind] = {
    "hierarchy": EpisodeKind("hierarchy", root="main", delegates=True, limit_reason="main_turn_limit"),
    "single": EpisodeKind("single", root="single", delegates=False, limit_reason="turn_limit"),
}


@dataclass
class Agent:
    """One agent of an episode: its trajectory, tools, turn budget and what it reads now."""

    name: str
    traj: AgentTrajectory
    tools: Mapping[str, Any]
    max_turns: int
    observation: str = ""
    pending: Turn | None = None  # a delegate turn waiting for its sub-agent's result
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def role(self) -> str:
        return self.traj.role


class Episode:
    """The episodes of one env (see the module docstring): ``reset`` starts one, ``act`` plays the
    selected agent's turn, ``finished`` says when it is over (``record`` holds everything).

    ``limits`` (or its fields as keywords) bound the turns; ``max_turns``, ``max_action_chars`` and
    ``max_observation_chars`` override the root agent's turn budget and the character limits.
    ``on_observation(agent_name)`` is called whenever an agent's observation changes (the AEC env keeps
    its ``infos`` current with it); ``seed_spaces`` are seeded from the episode's ``np_random`` at each
    seeding, before the task is drawn (the AEC env's action spaces).
    """

    def __init__(
        self,
        kind: str | EpisodeKind,
        scenario: str | Scenario = "wiki-hops",
        split: str = "stage2",
        *,
        seed: int | None = None,
        scenario_kwargs: Mapping[str, Any] | None = None,
        world: Any | None = None,
        tasks: Sequence[Task] | None = None,
        limits: Limits | None = None,
        rewards: RewardConfig | None = None,
        tools: Mapping[str, Sequence[str]] | None = None,
        max_turns: int | None = None,
        max_action_chars: int | None = None,
        max_observation_chars: int | None = None,
        on_observation: Callable[[str], None] | None = None,
        seed_spaces: Sequence[Any] = (),
        roles: Sequence[str] | None = None,
        **limit_kwargs: Any,
    ) -> None:
        if limits is not None and limit_kwargs:
            raise ValueError("pass either limits=Limits(...) or limit keywords, not both")
        self.kind = KINDS[kind] if isinstance(kind, str) else kind
        self.limits = limits if limits is not None else Limits(**limit_kwargs)
        self.reward_config = rewards or RewardConfig()
        root_turns = self.limits.max_main_turns if self.kind.delegates else self.limits.single_agent_turns
        self.max_turns = root_turns if max_turns is None else max_turns
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
        self.max_action_chars = self.limits.max_action_chars if max_action_chars is None else max_action_chars
        self.max_observation_chars = (self.limits.max_observation_chars if max_observation_chars is None
                                      else max_observation_chars)
        self.scenario = resolve_scenario(scenario, scenario_kwargs)
        self.split = split
        self.tasks = split_tasks(self.scenario, split, tasks)
        self.world = WorldHandle(self.scenario, world)
        self.default_seed = seed
        self.seeded = False
        self.np_random: Any = None
        self.np_random_seed: int | None = None
        self.on_observation = on_observation
        self.seed_spaces = list(seed_spaces)
        #: The roles this episode plays (``roles``: a run's, e.g. its mode's; default every role of the env).
        self.roles = tuple(self.kind.roles if roles is None else [r for r in self.kind.roles if r in roles])
        #: The root agent's call tools: tool name -> the roles it starts (those with a ``takes`` rule first).
        self.callees: dict[str, list[str]] = {}
        for role in self.roles:
            spec = ROLE_TABLE[role]
            if spec.called_by and self.kind.delegates:
                self.callees.setdefault(spec.called_by, []).append(role)
        for names in self.callees.values():
            names.sort(key=lambda role: ROLE_TABLE[role].takes is None)
        style = self.scenario.prompt_style if isinstance(self.scenario, StylesPrompts) else "full"
        # each role's tool set: the run's choice (``tools``: role -> names), else the scenario's; the root
        # agent also holds the call tool of a registered role it may call
        self.tools_of = {role: role_tools(self.scenario, role, (tools or {}).get(role)) for role in self.roles}
        calls = {ROLE_TABLE[r].called_by: ROLE_TABLE[r].call_tool for rs in self.callees.values() for r in rs
                 if ROLE_TABLE[r].call_tool is not None}
        root_tools = self.tools_of[self.kind.root]
        if any(name not in root_tools for name in calls):
            self.tools_of[self.kind.root] = MappingProxyType({**root_tools, **{n: t for n, t in calls.items()
                                                                                if n not in root_tools}})
        self.prompts = {role: system_prompt(role, specs, style) for role, specs in self.tools_of.items()}
        self.record: EpisodeRecord | None = None
        self.agents: dict[str, Agent] = {}
        self.selected: Agent | None = None
        self.finished = False

    # -- reset and seeding ------------------------------------------------------------------------

    def reset(self, seed: int | None = None, options: Mapping[str, Any] | None = None) -> Agent:
        """A new episode: reseed when ``seed`` is given (or at the first reset: the default seed), pick
        its task (``options``: ``task`` or ``task_id``, else drawn with ``np_random``); returns the root agent."""
        if seed is None and not self.seeded:
            seed = self.default_seed
        if seed is not None or not self.seeded:
            self.np_random, self.np_random_seed = seeding.np_random(seed)
            self.seeded = True
            for space in {id(s): s for s in self.seed_spaces}.values():
                space.seed(int(self.np_random.integers(2**31)))
        self.task = pick_task(self.tasks, self.np_random, options or {}, self.split)
        self.agents = {}
        self.finished = False
        self.record = EpisodeRecord(episode_id=uuid.uuid4().hex[:12], task=self.task.to_dict(), seed=seed)
        root = self.kind.root
        tools = self._root_tools()
        self.record.main = self._start(f"{root}_0", root, self.task.question, tools, self.max_turns).traj
        self.started = time.perf_counter()
        return self.selected

    def _root_tools(self) -> dict[str, Any]:
        """The root agent's tool instances: the single agent's are the world's; the main agent runs the
        env's own (delegation, answered by the episode) and any registered tool its tool set names."""
        if not self.kind.delegates:
            return self.world.make_tools()
        registered = [name for name in self.tools_of[self.kind.root] if name in TOOL_FACTORIES]
        return {name: TOOL_FACTORIES.get(name)(self.world.world) for name in registered}

    def _start(self, name: str, role: str, first_message: str, tools: Mapping[str, Any], max_turns: int,
               task: str | None = None, context: str | None = None) -> Agent:
        traj = AgentTrajectory(agent=name, role=role, task=task, context=context)
        traj.messages.append({"role": "system", "content": self.prompts[role]})
        traj.messages.append({"role": "user", "content": first_message})
        agent = self.agents[name] = Agent(name, traj, tools, max_turns)
        self.selected = agent
        self._observe(agent, first_message)
        return agent

    def _observe(self, agent: Agent, text: str) -> None:
        agent.observation = sanitize(text, self.max_observation_chars)
        if self.on_observation is not None:
            self.on_observation(agent.name)

    # -- the turn loop ----------------------------------------------------------------------------

    def act(self, text: str) -> None:
        """The selected agent's turn: parse -> record -> format error, final action, delegation or tool
        -> reply -> turn limit. The one turn loop of every env."""
        if self.finished or self.selected is None:
            raise RuntimeError("the episode is over: reset() starts the next one")
        agent = self.selected
        traj = agent.traj
        parsed = parse_action(text, role=agent.role, allowed_tools=self.tools_of[agent.role],
                              max_chars=self.max_action_chars)
        turn = Turn(action=text, kind=parsed.kind, error_kind=parsed.error_kind)
        traj.turns.append(turn)
        traj.messages.append({"role": "assistant", "content": text})
        if not parsed.ok:
            traj.format_errors += 1
            self._reply(agent, turn, format_error(parsed))
        elif parsed.kind == FINAL_TAGS[agent.role]:  # the role's final action (parse_action refuses the other's)
            traj.final = parsed.content
            self._end(agent, None)
            return
        elif parsed.tool_name in self.callees and agent.role == self.kind.root:
            if self._delegate(agent, turn, parsed):
                return  # the called agent acts next; the main agent's turn ends when it reports
        else:
            self._reply(agent, turn, self._run_tool(agent, parsed, turn))
        if len(traj.turns) >= agent.max_turns:
            traj.truncated = True
            self._end(agent, f"The sub-agent stopped at its limit of {agent.max_turns} turns without a result.")

    def _reply(self, agent: Agent, turn: Turn, observation: str) -> None:
        """What the agent reads next: the turn's observation, appended to its chat."""
        turn.observation = observation
        agent.traj.messages.append({"role": "user", "content": observation})
        self._observe(agent, observation)

    def _run_tool(self, agent: Agent, parsed: ParsedAction, turn: Turn) -> str:
        """The turn's tool call: its record goes on the turn, its latency into the episode's tool time."""
        turn.tool_call, out = call_tool(agent.tools, parsed)
        self.record.tool_s += turn.tool_call.latency_s
        return format_tool_response(out)

    def _delegate(self, main: Agent, turn: Turn, parsed: ParsedAction) -> bool:
        """Start an agent of the called role on the delegated subtask (True), or refuse the call (False: a tool
        error) past the limit or when no role takes it. ``max_delegations`` bounds the calls of each call
        tool per episode."""
        tool = parsed.tool_name
        n = sum(1 for s in self.record.subs if s.role in self.callees[tool])
        if n >= self.limits.max_delegations:
            return self._refuse(main, turn, parsed, f"limit: all {self.limits.max_delegations} delegations of this "
                                                    "episode are used; answer now.")
        callees = self.callees[tool]  # a rule (``takes``) shares the tool between roles: a role alone takes every call
        role = callees[0] if len(callees) == 1 else next(
            (r for r in callees if ROLE_TABLE[r].takes is None or ROLE_TABLE[r].takes(n, parsed.arguments)), None)
        if role is None:  # every role this episode plays on the tool has a rule, and none takes this call
            return self._refuse(main, turn, parsed, f"no agent of this team takes this {tool} call (call {n + 1}); "
                                                    "give other arguments or answer now.")
        spec = ROLE_TABLE[role]
        task, context = str(parsed.arguments.get("task", "")), parsed.arguments.get("context")
        name = f"{role}_{sum(1 for s in self.record.subs if s.role == role)}"
        context_text = str(context) if context is not None else None
        first = f"Subtask: {task}" + (f"\nContext: {context_text}" if context_text else "")
        max_turns = self.limits.max_sub_turns if spec.max_turns is None else spec.max_turns
        sub = self._start(name, role, first, {}, max_turns, task=task, context=context_text)
        turn.tool_call = ToolCall(tool, {"task": task, "context": context_text}, ok=True, meta={"agent": name})
        self.record.subs.append(sub.traj)
        sub.tools = self.world.make_tools()
        main.pending = turn
        return True

    def _refuse(self, main: Agent, turn: Turn, parsed: ParsedAction, error: str) -> bool:
        """A call tool's call refused: a failed tool call in the record and an error the root agent reads."""
        turn.tool_call = ToolCall(parsed.tool_name, dict(parsed.arguments), ok=False, error=error)
        self._reply(main, turn, format_tool_response(f"Error ({parsed.tool_name}): {error}"))
        return False

    def _end(self, agent: Agent, note: str | None) -> None:
        """``agent`` is done (its final action, or ``note``: its turn limit). The root's end finishes the
        episode; a sub-agent's result (or the note) is the tool response of its main agent's delegate call."""
        root = self.agents[f"{self.kind.root}_0"]
        if agent is root:
            self._finish(self.kind.limit_reason if agent.traj.truncated else "answer")
            return
        result = agent.traj.final
        self._reply(root, root.pending, format_tool_response(result if result is not None else note))
        self.selected = root
        if len(root.traj.turns) >= root.max_turns:
            root.traj.truncated = True
            self._finish(self.kind.limit_reason)

    # -- the finish -------------------------------------------------------------------------------

    def _expert(self, sub: AgentTrajectory) -> tuple[float | None, str]:
        """(r_expert, where it came from). No report scores 0; no scorer or a scorer with nothing to
        judge by gives None, which drops the term (b3 = 0, :func:`~mgrpo_env.rewards.paid_sub_reward`)."""
        scorer = self.reward_config.expert
        if scorer is None:
            return None, "none"
        if sub.final is None:
            return 0.0, "no_result"
        value = scorer(self.task, sub.task or "", sub.final)
        if value is None:
            return None, "none"
        if isinstance(value, ExpertScore):  # this value's own source (a subtask score that fell back to the hop)
            return float(value), value.source
        return float(value), getattr(scorer, "source", "custom")  # a user's scorer may name no source

    def _finish(self, end_reason: str) -> None:
        """Score the episode, pay every agent (R_M for the one that answers, its role's pay for each called
        agent, each with its run's extra terms), close the record. Each agent's ``components`` are its
        reward inputs (``mgrpo_env.rewards``) and its pay."""
        record = self.record
        main = record.main
        rewards = self.reward_config
        verdict, verify_error = safe_verify(self.scenario, self.task, main.final)
        correct = bool(verdict.correct) if verdict else False
        main.format_ok = main.final is not None and main.format_errors == 0
        paid: dict[str, Any] = {"format_ok": main.format_ok, "correct": correct,
                                "score": float(verdict.score) if verdict else 0.0, "turns": len(main.turns),
                                "format_errors": main.format_errors, "delegations": len(record.subs)}
        main.reward = paid["reward"] = reward_fns.root_pay(paid, rewards.main_weights, rewards.terms.get(main.role, ()))
        if verify_error:
            paid["verify_error"] = verify_error
        components: dict[str, dict[str, Any]] = {main.agent: paid}
        for sub in record.subs:
            sub.format_ok = sub.final is not None and sub.format_errors == 0
            sub.expert, source = self._expert(sub)
            inputs = {"format_ok": sub.format_ok, "main_correct": correct, "expert": sub.expert, "expert_source": source,
                      "turns": len(sub.turns), "format_errors": sub.format_errors, "report_chars": len(sub.final or "")}
            weights, format_gate = rewards.called_weights(sub.role)
            sub.reward = reward_fns.called_pay(ROLE_TABLE[sub.role].reward, inputs, weights, format_gate=format_gate,
                                               terms=rewards.terms.get(sub.role, ()))
            components[sub.agent] = {**inputs, "reward": sub.reward}
        record.final_answer = main.final
        record.correct = correct
        record.score = float(verdict.score) if verdict else 0.0
        record.truncated = main.final is None
        record.end_reason = end_reason
        record.rewards = {agent: c["reward"] for agent, c in components.items()}
        record.components = components
        record.wall_s = time.perf_counter() - self.started
        self.finished = True

    def close(self) -> None:
        """Close the world if this episode opened it (a shared world stays open: it is the caller's)."""
        self.world.close()


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
