"""Batched rollout collection: B questions x K rollouts, run concurrently.

Many env instances run at once. At each round every unfinished episode has exactly one selected
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

from .aec import MGRPOEnv
from .episode import EpisodeRecord

__all__ = ["PolicyRequest", "PolicyResponse", "Policy", "CollectStats", "collect", "collect_single"]


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
            channel, as BrowserGym's oracles have), which is why it is here.
        history: the ``extra`` dicts this policy attached to the agent's earlier turns, oldest first
            (an LLM policy keeps its exact prompt and sampled token ids there, so the next prompt is
            built from those ids and never from a re-tokenisation of the text).
    """

    episode: int
    agent: str
    role: str
    observation: str
    messages: list[dict[str, str]]
    task: Task
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
) -> list[EpisodeRecord]:
    """Run ``k`` rollouts of every task; returns records ordered task-major (task i, rollout j at i*k+j).

    Args:
        scenario: the scenario (verifier and task source).
        tasks: the B questions of this batch.
        k: rollouts per question (the group size of GRPO).
        policies: {"main": policy, "sub": policy}.
        world: an open world shared by all episodes (``with scenario.open() as world``).
        seed: episode i resets with ``seed + i``.
        max_workers: threads stepping envs (tool calls) at once.
        env_kwargs: limits and reward settings for :class:`MGRPOEnv`.
        stats: filled with timings when given.
        on_round: called with (finished episodes, total) after each round (progress bars).
        on_episode: called with each record as soon as its episode ends (an evaluation appends it to
            its JSONL, so an interrupted run keeps what it finished).
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    missing = {"main", "sub"} - set(policies)
    if missing:
        raise ValueError(f"policies needs the roles main and sub; missing {sorted(missing)}")
    stats = stats if stats is not None else CollectStats()
    started = time.perf_counter()
    envs: list[MGRPOEnv] = []
    for i in range(len(tasks) * k):
        env = MGRPOEnv(scenario, split="", world=world, tasks=tasks, **dict(env_kwargs or {}))
        env.reset(seed=seed + i, options={"task": tasks[i // k]})
        envs.append(env)
    records: list[EpisodeRecord | None] = [None] * len(envs)
    active = list(range(len(envs)))
    with ThreadPoolExecutor(max_workers=max(1, max_workers)) as pool:
        while active:
            waiting: dict[str, list[tuple[int, str]]] = defaultdict(list)
            still = []
            for i in active:
                env = envs[i]
                while env.agents and (env.terminations[env.agent_selection] or env.truncations[env.agent_selection]):
                    ended = env.agent_selection
                    role = env.infos[ended]["role"]
                    env.step(None)  # pay and retire finished agents
                    if role in policies:
                        _release(policies[role], i, ended)
                if not env.agents:
                    if records[i] is None and on_episode is not None:
                        on_episode(env.record)
                    records[i] = env.record
                    continue
                still.append(i)
                agent = env.agent_selection
                waiting[env.infos[agent]["role"]].append((i, agent))
            active = still
            if not active:
                break
            actions: dict[int, tuple[str, PolicyResponse]] = {}
            for role, items in waiting.items():
                requests = [_request(envs[i], i, agent, role) for i, agent in items]
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
            jobs = [(envs[i], *actions[i]) for i in active]
            list(pool.map(lambda job: _step(*job), jobs))
            stats.step_s += time.perf_counter() - t0
            stats.env_steps += len(active)
            if on_round is not None:
                on_round(sum(r is not None for r in records), len(records))
    for env in envs:
        env.close()  # the shared world stays open: it belongs to the caller
    out = [r for r in records if r is not None]
    stats.episodes += len(out)
    stats.tool_s += sum(r.tool_s for r in out)
    stats.wall_s += time.perf_counter() - started
    return out


def _request(env: MGRPOEnv, episode: int, agent: str, role: str) -> PolicyRequest:
    turns = env.trajectory(agent).turns
    return PolicyRequest(
        episode, agent, role, env.observe(agent)["text"], env.infos[agent]["messages"], env.task, [t.extra for t in turns]
    )


def _step(env: MGRPOEnv, agent: str, response: PolicyResponse) -> None:
    env.step(response.text)
    if response.extra:
        env.last_turn(agent).extra.update(response.extra)


def collect_single(
    scenario: Scenario,
    tasks: Sequence[Task],
    k: int,
    policy: Policy,
    *,
    world: Any,
    seed: int = 0,
    max_workers: int = 8,
    env_kwargs: Mapping[str, Any] | None = None,
    stats: CollectStats | None = None,
    on_episode: Callable[[EpisodeRecord], None] | None = None,
) -> list[EpisodeRecord]:
    """:func:`collect` for the single-agent baseline: K rollouts of each task in the Gymnasium env.

    Requests have role "single" and agent "single_0"; records are ordered task-major. ``on_episode``
    gets each record as its episode ends, as in :func:`collect`.
    """
    from .single import SingleAgentEnv

    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    stats = stats if stats is not None else CollectStats()
    started = time.perf_counter()
    envs = []
    observations = []
    for i in range(len(tasks) * k):
        env = SingleAgentEnv(scenario, split="", world=world, tasks=tasks, **dict(env_kwargs or {}))
        obs, _ = env.reset(seed=seed + i, options={"task": tasks[i // k]})
        envs.append(env)
        observations.append(obs["text"])
    active = list(range(len(envs)))
    with ThreadPoolExecutor(max_workers=max(1, max_workers)) as pool:
        while active:
            requests = [
                PolicyRequest(i, "single_0", "single", observations[i], envs[i].record.main.messages, envs[i].task,
                              [t.extra for t in envs[i].record.main.turns])
                for i in active
            ]
            t0 = time.perf_counter()
            responses = policy(requests)
            stats.policy_s += time.perf_counter() - t0
            stats.policy_calls += 1
            stats.by_role_requests["single"] += len(requests)
            if len(responses) != len(requests):
                raise ValueError(f"the single policy returned {len(responses)} responses for {len(requests)} requests")
            responses = [r if isinstance(r, PolicyResponse) else PolicyResponse(str(r)) for r in responses]

            def step(job: tuple[int, PolicyResponse]) -> bool:
                i, response = job
                obs, _, terminated, truncated, _ = envs[i].step(response.text)
                if response.extra:
                    envs[i].record.main.turns[-1].extra.update(response.extra)
                observations[i] = obs["text"]
                return terminated or truncated

            t0 = time.perf_counter()
            done = list(pool.map(step, list(zip(active, responses, strict=True))))
            stats.step_s += time.perf_counter() - t0
            stats.env_steps += len(active)
            for i, d in zip(active, done, strict=True):
                if d:
                    _release(policy, i, "single_0")
                    if on_episode is not None:
                        on_episode(envs[i].record)
            active = [i for i, d in zip(active, done, strict=True) if not d]
    records = [env.record for env in envs]
    for env in envs:
        env.close()
    stats.episodes += len(records)
    stats.tool_s += sum(r.tool_s for r in records)
    stats.wall_s += time.perf_counter() - started
    return records
