"""Batched rollout collection: B questions x K rollouts, run concurrently.

Many episodes run at once, of the hierarchy or of the single agent, each the one episode core
(:class:`~mgrpo_env.episode_core.Episode`) that the AEC and Gymnasium envs adapt (:data:`~mgrpo_env.episode_core.KINDS`). At each round every unfinished episode has exactly one selected
agent; the requests of the same role are gathered into one call of that role's policy (so one
LLM forward serves many episodes), then the envs step in a thread pool, so tool calls of
different episodes overlap.

A policy maps a list of :class:`PolicyRequest` to a list of responses (``str`` or
:class:`PolicyResponse`, whose ``extra`` - sampled token ids, log-probabilities - is stored on the
turn it produced).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from mgrpo_scenarios import Scenario, Task

from .episode import EpisodeRecord
from .episode_core import KINDS, Episode
from .protocol import require_text

__all__ = ["PolicyRequest", "PolicyResponse", "Policy", "CollectStats", "collect"]


@dataclass
class PolicyRequest:
    """What a policy sees for one agent of one episode.

    Attributes:
        episode: index of the episode in this collection (task index * K + rollout index).
        agent: "main_0", "sub_3", ...
        role: "main" or "sub".
        observation: the text the agent must read now.
        messages: the agent's whole chat so far (system prompt first).
        task: the episode's task. Learned policies must not read it; scripted oracles do (a "cheat"
            channel, as BrowserGym's oracles have), which is why it is here. None past the worker
            boundary (:mod:`mgrpo_env.turn_requests`: the gold answer never leaves the env's process).
        history: the ``extra`` dicts this policy attached to the agent's earlier turns, oldest first
            (an LLM policy keeps its exact prompt and sampled token ids there, so the next prompt is
            built from those ids and never from a re-tokenisation of the text).
    """

    episode: int
    agent: str
    role: str
    observation: str
    messages: list[dict[str, str]]
    task: Task | None
    history: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class PolicyResponse:
    """A policy's action text and whatever it wants kept with the turn (token ids, logprobs...)."""

    text: str
    extra: dict[str, Any] = field(default_factory=dict)


class Policy(Protocol):
    """Maps requests to responses. A policy may also define ``release(episode, agent)``: the rollout
    loops call it once an agent has ended, so per-agent state (an LLM's KV cache) can be freed."""

    def __call__(self, requests: Sequence[PolicyRequest]) -> Sequence[str | PolicyResponse]: ...


def _release(policy: Policy, episode: int, agent: str) -> None:
    release = getattr(policy, "release", None)
    if release is not None:
        release(episode, agent)


@dataclass
class CollectStats:
    """Where the time went: policy calls, env steps (tools included), and counts."""

    episodes: int = 0
    env_steps: int = 0
    policy_calls: int = 0
    policy_s: float = 0.0
    step_s: float = 0.0
    tool_s: float = 0.0
    wall_s: float = 0.0
    by_role_requests: dict[str, int] = field(default_factory=lambda: defaultdict(int))


class _Rollout:
    """One rollout: the one episode core (:class:`~mgrpo_env.episode_core.Episode`) of its kind, its
    selected agent asked in turn; the agents are released together once the episode is over."""

    def __init__(self, kind: str, scenario: Scenario, tasks: Sequence[Task], task: Task, world: Any, seed: int,
                 env_kwargs: Mapping[str, Any], roles: Sequence[str]) -> None:
        self.episode = Episode(kind, scenario, split="", world=world, tasks=tasks, roles=roles, **dict(env_kwargs))
        self.episode.reset(seed=seed, options={"task": task})
        self.released = False

    def next_agent(self, release: Callable[[str, str], None]) -> tuple[str, str] | None:
        """(agent, role) that acts now, or None once the episode is over (every agent released then,
        in the order they started)."""
        episode = self.episode
        if not episode.finished:
            return episode.selected.name, episode.selected.role
        if not self.released:
            for agent in episode.agents.values():
                release(agent.role, agent.name)
            self.released = True
        return None

    def request(self, index: int, agent: str, role: str) -> PolicyRequest:
        state = self.episode.agents[agent]
        return PolicyRequest(index, agent, role, state.observation, state.traj.messages, self.episode.task,
                             [t.extra for t in state.traj.turns])

    def act(self, agent: str, response: PolicyResponse) -> None:
        self.episode.act(require_text(response.text, agent))
        if response.extra:
            self.episode.agents[agent].traj.turns[-1].extra.update(response.extra)

    @property
    def record(self) -> EpisodeRecord:
        return self.episode.record

    def close(self) -> None:
        self.episode.close()  # the shared world stays open: it belongs to the caller


def collect(
    scenario: Scenario,
    tasks: Sequence[Task],
    k: int,
    policies: Mapping[str, Policy],
    *,
    world: Any,
    seed: int = 0,
    max_workers: int = 8,
    env_kwargs: Mapping[str, Any] | None = None,
    stats: CollectStats | None = None,
    on_round: Callable[[int, int], None] | None = None,
    on_episode: Callable[[EpisodeRecord], None] | None = None,
    env: str = "hierarchy",
) -> list[EpisodeRecord]:
    """Run ``k`` rollouts of every task; returns records ordered task-major (task i, rollout j at i*k+j).

    Args:
        scenario: the scenario (verifier and task source).
        tasks: the B questions of this batch.
        k: rollouts per question (the group size of GRPO).
        policies: one per role that plays: the env's root ("main" for the hierarchy, "single" for the single
            agent) and each called role of the env that the run plays ("sub", a registered role): the root's
            calls start only roles with a policy.
        world: an open world shared by all episodes (``with scenario.open() as world``).
        seed: episode i resets with ``seed + i``.
        max_workers: threads stepping envs (tool calls) at once.
        env_kwargs: limits, reward settings and tools of the episode (:class:`~mgrpo_env.episode_core.Episode`).
        stats: filled with timings when given.
        on_round: called with (finished episodes, total) after each round (progress bars).
        on_episode: called with each record as soon as its episode ends (an evaluation appends it to
            its JSONL, so an interrupted run keeps what it finished).
        env: "hierarchy" or "single": the kind of episode (:data:`~mgrpo_env.episode_core.KINDS`).
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    kind = KINDS[env]
    if kind.root not in policies:  # a called role plays when it has a policy (a mode may leave the sub-agents out)
        raise ValueError(f"policies needs the {env} env's root role {kind.root!r}; got {sorted(policies)}")
    roles = tuple(role for role in kind.roles if role in policies)
    stats = stats if stats is not None else CollectStats()
    started = time.perf_counter()
    episodes = [_Rollout(env, scenario, tasks, tasks[i // k], world, seed + i, env_kwargs or {}, roles)
                for i in range(len(tasks) * k)]
    records: list[EpisodeRecord | None] = [None] * len(episodes)
    active = list(range(len(episodes)))
    with ThreadPoolExecutor(max_workers=max(1, max_workers)) as pool:
        while active:
            waiting: dict[str, list[tuple[int, str]]] = defaultdict(list)
            still = []
            for i in active:
                selected = episodes[i].next_agent(lambda role, agent, i=i: _release(policies[role], i, agent)
                                                  if role in policies else None)
                if selected is None:
                    if records[i] is None and on_episode is not None:
                        on_episode(episodes[i].record)
                    records[i] = episodes[i].record
                    continue
                still.append(i)
                waiting[selected[1]].append((i, selected[0]))
            active = still
            if not active:
                break
            actions: dict[int, tuple[str, PolicyResponse]] = {}
            for role, items in waiting.items():
                requests = [episodes[i].request(i, agent, role) for i, agent in items]
                t0 = time.perf_counter()
                responses = policies[role](requests)
                stats.policy_s += time.perf_counter() - t0
                stats.policy_calls += 1
                stats.by_role_requests[role] += len(requests)
                if len(responses) != len(requests):
                    raise ValueError(f"the {role} policy returned {len(responses)} responses for {len(requests)} requests")
                for (i, agent), response in zip(items, responses, strict=True):
                    if not isinstance(response, PolicyResponse):
                        response = PolicyResponse(str(response))
                    actions[i] = (agent, response)
            t0 = time.perf_counter()
            jobs = [(episodes[i], *actions[i]) for i in active]
            list(pool.map(lambda job: job[0].act(job[1], job[2]), jobs))
            stats.step_s += time.perf_counter() - t0
            stats.env_steps += len(active)
            if on_round is not None:
                on_round(sum(r is not None for r in records), len(records))
    for episode in episodes:
        episode.close()
    out = [r for r in records if r is not None]
    stats.episodes += len(out)
    stats.tool_s += sum(r.tool_s for r in out)
    stats.wall_s += time.perf_counter() - started
    return out
