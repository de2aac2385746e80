"""Conformance checks the env ships with: PettingZoo's and Gymnasium's checkers plus our own.

    from mgrpo_env.checks import check_all
    check_all(scenario, world=world, split="stage2/test")

runs, for the AEC env, ``pettingzoo.test.api_test``, ``seed_test`` and ``render_test`` (every render
mode: "ansi" returns text, "human" prints it and returns None), and for the single-agent env
``gymnasium.utils.env_checker.check_env`` (its render checks included), then our invariants: every agent name is fresh per
delegation, every episode ends with every agent paid exactly once, and rewards lie in [0, 1].
The test suite calls it for every built-in scenario and a grid of limit settings.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from gymnasium.utils.env_checker import check_env
from pettingzoo.test import api_test, render_test, seed_test

from .aec import env as aec_env
from .single import SingleAgentEnv, single_agent_env

__all__ = ["check_aec", "check_single", "check_invariants", "check_all"]


def check_aec(scenario: Any, *, world: Any, split: str, num_cycles: int = 1000, **options: Any) -> None:
    """PettingZoo's ``api_test``, ``seed_test`` and ``render_test`` on the AEC env built with ``options``."""

    def make(render_mode: str | None = None) -> Any:
        return aec_env(scenario=scenario, world=world, split=split, render_mode=render_mode, **options)

    env = make()
    try:
        api_test(env, num_cycles=num_cycles, verbose_progress=False)
    finally:
        env.close()
    seed_test(make, num_cycles=min(num_cycles, 200))
    render_test(make)


def check_single(scenario: Any, *, world: Any, split: str, **options: Any) -> None:
    """Gymnasium's ``check_env`` (render checks included) on the single-agent env built with ``options``,
    once per render mode."""
    for render_mode in (None, *SingleAgentEnv.metadata["render_modes"]):
        env = single_agent_env(scenario=scenario, world=world, split=split, render_mode=render_mode, **options)
        try:
            with warnings.catch_warnings():  # our loop covers what it would re-make through env.spec
                warnings.filterwarnings("ignore", message=".*alternative render modes.*")
                check_env(env)
        finally:
            env.close()


def check_invariants(scenario: Any, *, world: Any, split: str, episodes: int = 20, **options: Any) -> dict[str, int]:
    """Random play: fresh agent names, every agent paid once at the end, rewards in [0, 1].

    Returns counts (episodes, agents seen, steps) so a caller can assert the hierarchy was reached.
    Raises AssertionError with a message on any violation.
    """
    env = aec_env(scenario=scenario, world=world, split=split, **options)
    seen_agents: set[str] = set()
    steps = 0
    try:
        for episode in range(episodes):
            env.reset(seed=episode)
            finished: set[str] = set()
            paid: dict[str, float] = {}
            for agent in env.agent_iter(10_000):
                _, reward, term, trunc, _ = env.last()
                assert agent not in finished, f"agent {agent} acted after it finished"
                if term or trunc:
                    finished.add(agent)
                    paid[agent] = reward
                    env.step(None)
                    continue
                steps += 1
                env.step(env.action_space(agent).sample())
            record = env.unwrapped.record
            names = [s.agent for s in record.subs]
            assert names == [f"sub_{i}" for i in range(len(names))], f"sub-agent names not fresh: {names}"
            assert set(paid) == {"main_0", *names}, f"not every agent was paid: {sorted(paid)}"
            _check_rewards(paid)
            seen_agents |= set(paid)
    finally:
        env.close()
    return {"episodes": episodes, "agents_seen": len(seen_agents), "steps": steps}


def _check_rewards(paid: Mapping[str, float]) -> None:
    for agent, reward in paid.items():
        assert 0.0 <= reward <= 1.0 + 1e-9, f"{agent} was paid {reward}, outside [0, 1]"


def check_all(scenario: Any, *, world: Any, split: str, **options: Any) -> dict[str, int]:
    """All of the above with the same options (single-agent options are taken from the AEC ones)."""
    check_aec(scenario, world=world, split=split, **options)
    single_opts = {k: v for k, v in options.items() if k in ("max_action_chars", "max_observation_chars")}
    check_single(scenario, world=world, split=split, **single_opts)
    return check_invariants(scenario, world=world, split=split, **options)
