"""The mgrpo envs as an OpenEnv server: the AEC hierarchy or the single-agent env over WebSocket.

Built on openenv-core's own server: :class:`HierarchyEnvironment` and :class:`SingleEnvironment` are
its ``Environment`` subclasses, :func:`create_app` wraps them in its ``HTTPEnvServer`` (the ``/ws``
session protocol, ``/health``, ``/schema``, ``/metadata``), and :mod:`mgrpo_env.openenv_client` is its
``EnvClient``. ``mgrpo serve-env --scenario wiki-hops [--single] --port 8000`` runs it.

Sessions: each WebSocket connection is one session with its own env instance (openenv-core's
``/ws``); the client opens a fresh session for each episode. Every session shares the server's one
world (the loopback site, the search index, the browser): the URL policy, the tools and the limits
are the in-process env's, unchanged. A session whose client goes away is closed by the server and
its env with it (``GET /sessions`` counts the open ones and the browser pages in use).

Secrets: ``state()`` and every observation carry the question and what the agents may see; the
task's gold answer, aliases, hops and metadata only once the episode is over (the final record, and
``state()`` then), or throughout on a server started with ``reveal_answers`` (``--reveal-answers``,
for evaluation tools).

Contract kept: the server wraps the in-process env itself, so the agent order, the fresh ``sub_<n>``
per delegation, the rewards and the episode record are the in-process ones. A step by an agent that
is not the selected one, a step after the end and a step before a reset are refused with a clear
error (the session stays usable); a malformed action (not the schema) is refused by openenv-core's
validation; malformed text is a format failure the agent reads, as in process.

Needs the ``openenv`` extra. Never imports torch.
"""

from __future__ import annotations

import functools
import threading
from abc import abstractmethod
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI

from .aec import MGRPOEnv
from .core import Limits
from .openenv_types import (  # openenv-core's classes, imported there without its web UI
    SINGLE_AGENT,
    AgentAction,
    AgentObservation,
    ConcurrencyConfig,
    Environment,
    EnvironmentMetadata,
    EpisodeState,
    HTTPEnvServer,
    public_task,
)
from .single import SingleAgentEnv

__all__ = ["HierarchyEnvironment", "SingleEnvironment", "EnvSpec", "create_app", "DEFAULT_MAX_SESSIONS"]

#: Sessions served at once by default (the issue's target is 16 concurrent sessions).
DEFAULT_MAX_SESSIONS = 64


class EnvSpec:
    """What every session's env is built from: the scenario (resolved once), its split, the limits,
    the shared open world and the env keywords (``rewards``, ``tools``).

    ``reveal_answers``: ``state()`` shows the whole task (gold answer, aliases, hops, metadata) while
    the episode runs, for evaluation tools and scripted oracles; False (the default) keeps them on the
    server until the episode is over, so that no client on the port can read the reward's references."""

    def __init__(self, scenario: Any, split: str, world: Any, limits: Limits | None = None,
                 env_kwargs: Mapping[str, Any] | None = None, *, reveal_answers: bool = False) -> None:
        self.scenario = scenario
        self.split = split
        self.world = world
        self.limits = limits or Limits()
        self.env_kwargs = dict(env_kwargs or {})
        self.reveal_answers = reveal_answers
        self.envs_built = 0  # session envs built so far (openenv-core's /metadata and /state build one too)
        self._count_lock = threading.Lock()

    def count_env(self) -> None:
        with self._count_lock:
            self.envs_built += 1


class _SessionEnvironment(Environment[AgentAction, AgentObservation, EpisodeState]):
    """What both envs share over the wire: the reset / step bookkeeping and the refusals."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # each session has its own env; the shared world is thread-safe
    kind = ""

    def __init__(self, spec: EnvSpec) -> None:
        super().__init__()
        self.spec = spec
        spec.count_env()
        self._episode = False  # a reset happened in this session
        self._done = False
        self._steps = 0
        self._episode_id: str | None = None

    # -- the hooks each env fills ---------------------------------------------------------------

    @abstractmethod
    def _reset_env(self, seed: int | None, options: dict[str, Any]) -> None: ...

    @abstractmethod
    def _step_env(self, agent: str, text: str) -> None: ...

    @abstractmethod
    def _selected(self) -> str: ...

    @abstractmethod
    def _observe(self) -> AgentObservation: ...

    @abstractmethod
    def _record(self) -> Any: ...

    # -- openenv-core's Environment API ----------------------------------------------------------

    def reset(self, seed: int | None = None, episode_id: str | None = None, task_id: str | None = None,
              **kwargs: Any) -> AgentObservation:
        if kwargs:
            raise ValueError(f"unknown reset option(s) {sorted(kwargs)}: reset takes seed, episode_id and task_id")
        self._reset_env(seed, {"task_id": task_id} if task_id is not None else {})
        if episode_id is not None:
            self._record().episode_id = episode_id
        self._episode, self._done, self._steps = True, False, 0
        self._episode_id = self._record().episode_id
        return self._observe()

    def step(self, action: AgentAction, timeout_s: float | None = None, **kwargs: Any) -> AgentObservation:
        if not self._episode:
            raise RuntimeError("no episode in this session: reset() first")
        if self._done:
            record = self._record()
            raise RuntimeError(f"the episode {record.episode_id} is over ({record.end_reason}): reset() to start another")
        selected = self._selected()
        if action.agent != selected:
            raise ValueError(f"agent {action.agent!r} may not act now: the selected agent is {selected!r}")
        self._step_env(action.agent, action.text)
        self._steps += 1
        observation = self._observe()
        self._done = observation.done
        return observation

    @property
    def state(self) -> EpisodeState:
        task, shown = None, False
        if self._episode:  # the references stay here until the end (the final record holds them then)
            shown = self._done or self.spec.reveal_answers
            task = dict(self._record().task) if shown else public_task(self._record().task)
        return EpisodeState(episode_id=self._episode_id, step_count=self._steps, env=self.kind,
                            scenario=str(getattr(self.spec.scenario, "name", self.spec.scenario)),
                            split=self.spec.split, task=task, answers_shown=shown, done=self._done,
                            agent=None if not self._episode or self._done else self._selected())

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(name=f"mgrpo-{self.kind}", version="0",
                                   description=(self.__class__.__doc__ or "").strip().splitlines()[0])


class HierarchyEnvironment(_SessionEnvironment):
    """The M-GRPO hierarchy (main_0 delegating to sub_<n>): the PettingZoo AEC env of one session."""

    kind = "hierarchy"

    def __init__(self, spec: EnvSpec) -> None:
        super().__init__(spec)
        self.env = MGRPOEnv(spec.scenario, spec.split, world=spec.world, limits=spec.limits, **spec.env_kwargs)

    def _reset_env(self, seed: int | None, options: dict[str, Any]) -> None:
        self.env.reset(seed=seed, options=options)

    def _step_env(self, agent: str, text: str) -> None:
        self.env.step(text)

    def _selected(self) -> str:
        return self.env.agent_selection

    def _record(self) -> Any:
        return self.env.record

    def _observe(self) -> AgentObservation:
        env, record = self.env, self.env.record
        ended = bool(record.end_reason)
        agent = env.agent_selection
        terminated = ended and not record.truncated
        return AgentObservation(
            agent=None if ended else agent,
            text="" if ended else env.observe(agent)["text"],
            messages=[] if ended else list(env.infos[agent]["messages"]),
            agents=list(env.agents),
            rewards={a: float(r) for a, r in env.rewards.items()},
            reward_components={a: dict(c) for a, c in record.components.items()} if ended else {},
            terminated=terminated, truncated=ended and not terminated, done=ended,
            reward=float(env.rewards.get("main_0", 0.0)),
            record=record.to_dict() if ended else None,
        )

    def close(self) -> None:
        self.env.close()  # the shared world is the server's: the env closes only what it opened


class SingleEnvironment(_SessionEnvironment):
    """The single-agent baseline (one agent, single_0, with every tool): the Gymnasium env of one session."""

    kind = "single"

    def __init__(self, spec: EnvSpec) -> None:
        super().__init__(spec)
        self.env = SingleAgentEnv(spec.scenario, spec.split, world=spec.world, limits=spec.limits, **spec.env_kwargs)
        self._last: tuple[dict[str, str], float, bool, bool, dict[str, Any]] | None = None

    def _reset_env(self, seed: int | None, options: dict[str, Any]) -> None:
        obs, info = self.env.reset(seed=seed, options=options)
        self._last = (obs, 0.0, False, False, info)

    def _step_env(self, agent: str, text: str) -> None:
        self._last = self.env.step(text)

    def _selected(self) -> str:
        return SINGLE_AGENT

    def _record(self) -> Any:
        return self.env.record

    def _observe(self) -> AgentObservation:
        assert self._last is not None
        obs, reward, terminated, truncated, info = self._last
        ended = terminated or truncated
        components = info.get("reward_components")
        return AgentObservation(
            agent=None if ended else SINGLE_AGENT, text="" if ended else obs["text"],
            messages=[] if ended else list(info["messages"]), agents=[SINGLE_AGENT],
            rewards={SINGLE_AGENT: float(reward)},
            reward_components={SINGLE_AGENT: dict(components)} if components else {},
            terminated=terminated, truncated=truncated, done=ended, reward=float(reward),
            record=self.env.record.to_dict() if ended else None,
        )

    def close(self) -> None:
        self.env.close()


def create_app(spec: EnvSpec, *, single: bool = False, max_sessions: int = DEFAULT_MAX_SESSIONS,
               session_timeout_s: float | None = None) -> FastAPI:
    """openenv-core's FastAPI app over ``spec``'s env (the hierarchy, or the single agent with
    ``single=True``), plus ``GET /sessions``: ``{"active_sessions": n, "max_sessions": m,
    "browser_pages": p, "envs_built": b}`` (the browser's pages in use, 0 when idle: what a leak would
    show; the session envs built since the start).

    ``session_timeout_s``: openenv-core's idle-session reaper closes a session idle that long (None:
    only a disconnect closes it).
    """
    env_class = SingleEnvironment if single else HierarchyEnvironment
    # A partial of the class: openenv-core reads SUPPORTS_CONCURRENT_SESSIONS off it without building one.
    factory = functools.partial(env_class, spec)
    server = HTTPEnvServer(factory, AgentAction, AgentObservation,
                           concurrency_config=ConcurrencyConfig(max_concurrent_envs=max_sessions,
                                                                session_timeout=session_timeout_s))
    app = FastAPI(title=f"mgrpo {env_class.kind} env (OpenEnv)", version="0")
    server.register_routes(app)

    @app.get("/sessions", tags=["Health"], summary="open sessions and browser pages in use")
    def sessions() -> dict[str, int]:
        return {"active_sessions": server.active_sessions, "max_sessions": server.max_concurrent_envs,
                "browser_pages": browser_pages(spec.world), "envs_built": spec.envs_built}

    app.state.env_server = server  # for in-process callers (tests, benchmarks)
    return app


def browser_pages(world: Any) -> int:
    """Pages the world's browser has open for fetches now (0 without a started browser)."""
    browser = getattr(world, "browser", None)  # None: a world without a browser (browser_mode="never")
    return 0 if browser is None else int(browser.pages_open())
