"""The env's conformance checks on the built-in scenario and a grid of limit settings."""

from __future__ import annotations

import pytest

import mgrpo_scenarios
from mgrpo_env.checks import check_all

OPTION_GRID = [
    {},
    {"max_main_turns": 2, "max_sub_turns": 1, "max_delegations": 1},
    {"max_delegations": 0},
    {"max_action_chars": 64, "max_observation_chars": 256},
]


@pytest.mark.parametrize("split", ["stage1/test", "stage2/test"])
@pytest.mark.parametrize("options", OPTION_GRID, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "defaults")
def test_conformance(small_scenario, small_world, split, options):
    counts = check_all(small_scenario, world=small_world, split=split, **options)
    if options.get("max_delegations", 4) > 0 and options.get("max_action_chars", 4000) >= 200:
        assert counts["agents_seen"] >= 2  # random play reached sub-agents (64-char actions cannot delegate)


def test_every_registered_scenario_is_checked():
    # a new built-in scenario must be added to the conformance tests: wiki-hops runs above; the
    # benchmark scenarios (and qa-file) need the user's data files and a search backend, and are checked on
    # fixtures against a loopback web in tests/test_benchmarks.py
    assert mgrpo_scenarios.names() == ["gaia", "qa-file", "webwalkerqa", "wiki-hops", "xbench-deepsearch"]


def test_human_render_prints_and_returns_none(small_scenario, small_world, capsys):
    # PettingZoo's render_test and Gymnasium's check_env need "human" to print and return None
    from mgrpo_env import env as aec_env
    from mgrpo_env import single_agent_env

    aec = aec_env(small_scenario, "stage2/test", world=small_world, render_mode="human")
    aec.reset(seed=0)
    capsys.readouterr()
    assert aec.render() is None
    assert capsys.readouterr().out.startswith("[main_0]")
    aec.step("<think>x</think><answer>1</answer>")  # human mode prints after each step by itself
    assert "main_0 turn 1" in capsys.readouterr().out
    assert aec_env(small_scenario, "stage2/test", world=small_world, render_mode="ansi").render is not None
    single = single_agent_env(small_scenario, "stage2/test", world=small_world, render_mode="human")
    single.reset(seed=0)
    assert capsys.readouterr().out.startswith("[single_0]")
    single.step("<think>x</think><answer>1</answer>")
    assert single.render() is None and capsys.readouterr().out.count("single_0 turn 1") == 2
    text_env = single_agent_env(small_scenario, "stage2/test", world=small_world, render_mode="ansi")
    text_env.reset(seed=0)
    assert text_env.render().startswith("[single_0]") and capsys.readouterr().out == ""
