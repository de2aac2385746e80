"""The episode core both envs run on: the same turn record, tool call, pay and render in each."""

from __future__ import annotations

import mgrpo_env


def test_both_envs_render_the_last_turn_alike(small_scenario, small_world):
    bad = "no protocol here"
    hierarchy = mgrpo_env.env(scenario=small_scenario, split="stage1/test", world=small_world, seed=0, render_mode="ansi")
    single = mgrpo_env.single_agent_env(scenario=small_scenario, split="stage1/test", world=small_world, seed=0,
                                        render_mode="ansi")
    try:
        hierarchy.reset(seed=0)
        single.reset(seed=0)
        question = hierarchy.unwrapped.record.task["question"]
        assert hierarchy.render() == f"[main_0] {question[:500]}"
        assert single.render() == f"[single_0] {single.unwrapped.task.question[:500]}"
        hierarchy.step(bad)
        single.step(bad)
        main_turn = hierarchy.unwrapped.trajectory("main_0").turns[-1]
        single_turn = single.unwrapped.record.main.turns[-1]
        assert main_turn.kind == single_turn.kind == "error" and main_turn.observation == single_turn.observation
        assert hierarchy.render() == f"[main_0 turn 1] {bad!r} -> {main_turn.observation[:300]!r}"
        assert single.render() == f"[single_0 turn 1] {bad!r} -> {single_turn.observation[:300]!r}"
    finally:
        hierarchy.close()
        single.close()
