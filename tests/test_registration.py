"""The env through its ecosystems' front doors: ``gymnasium.make`` and a PettingZoo-style module."""

from __future__ import annotations

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env
from pettingzoo.test import api_test, seed_test

import mgrpo_env
from mgrpo_env import wiki_hops_v0
from mgrpo_env.single import SingleAgentEnv


@pytest.fixture
def small_kwargs(small_scenario, small_world):
    """The session's small world, named the way a user names it (scenario kwargs), shared open."""
    return {"scenario_kwargs": {"num_entities": 300, "data_dir": str(small_scenario.data_dir)}, "world": small_world,
            "split": "stage2/test"}


def test_gymnasium_make_builds_the_single_agent_env_and_passes_check_env(small_kwargs):
    assert mgrpo_env.GYMNASIUM_ID == "mgrpo/WikiHops-v0" and mgrpo_env.GYMNASIUM_ID in gymnasium.registry
    # no shared world: check_env re-makes the env from its spec per render mode, deep-copying the
    # kwargs, so each env opens (and closes) its own
    kwargs = {k: v for k, v in small_kwargs.items() if k != "world"}
    env = gymnasium.make("mgrpo/WikiHops-v0", max_turns=4, **kwargs)
    try:
        assert isinstance(env.unwrapped, SingleAgentEnv)
        assert env.unwrapped.scenario.name == "wiki-hops" and env.unwrapped.scenario.num_entities == 300
        assert env.unwrapped.max_turns == 4
        check_env(env.unwrapped)  # includes every render mode, through env.spec
        obs, info = env.reset(seed=3)
        assert obs["text"] == env.unwrapped.task.question and info["messages"][0]["role"] == "system"
        _, reward, terminated, truncated, _ = env.step("<think>guess</think><answer>nobody</answer>")
        assert terminated and not truncated and reward == pytest.approx(0.1)  # format ok, wrong
    finally:
        env.close()


def test_gymnasium_make_render_modes(small_kwargs, capsys):
    env = gymnasium.make("mgrpo/WikiHops-v0", render_mode="human", **small_kwargs)
    env.reset(seed=0)
    assert env.render() is None and "[single_0]" in capsys.readouterr().out
    env.close()


def test_pettingzoo_module_env_and_raw_env(small_kwargs):
    raw = wiki_hops_v0.raw_env(**small_kwargs)
    assert type(raw).__name__ == "MGRPOEnv" and raw.scenario.name == "wiki-hops"
    env = wiki_hops_v0.env(**small_kwargs)
    assert env.unwrapped is not env  # wrapped (order enforcing)
    api_test(env, num_cycles=200, verbose_progress=False)
    seed_test(lambda: wiki_hops_v0.env(**small_kwargs), num_cycles=50)
    with pytest.raises(TypeError, match="always runs"):
        wiki_hops_v0.env(scenario="gaia")
