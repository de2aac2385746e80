"""Rewards that do not pay guessing: the gated format term, the expert score against the delegated
subtask, both paid alike by the env and by the sub worker; the paired interval of a rate's change."""

from __future__ import annotations

import pytest

from mgrpo_env.core import SUBTASK_FELL_BACK, RewardConfig, expert_scorer, hop_expert_score
from mgrpo_env.rewards import paid_sub_reward


def test_gated_format_term_by_hand():
    w = (0.1, 0.4, 0.5)
    assert paid_sub_reward(True, 0, 0.0, w) == pytest.approx(0.1)  # the paper pays a wrong report's form
    assert paid_sub_reward(True, 0, 0.0, w, format_gate=True) == 0.0
    assert paid_sub_reward(True, 1, 0.5, w, format_gate=True) == pytest.approx(0.1 * 0.5 + 0.4 + 0.5 * 0.5)
    assert paid_sub_reward(True, 1, None, w, format_gate=True) == pytest.approx(0.1 + 0.4)  # nothing to gate by
    assert paid_sub_reward(False, 1, 1.0, w, format_gate=True) == 0.0
    with pytest.raises(ValueError, match=r"^expert must be in \[0, 1\], got 1\.5$"):
        paid_sub_reward(True, 0, 1.5, w, format_gate=True)
    with pytest.raises(ValueError, match=r"^sub weights must hold 3 numbers, got 2"):
        paid_sub_reward(True, 0, 0.5, (0.1, 0.4))
    # no expert score: no expert term, whatever b3 is (with b3 = 0.7 an expert of 0 pays the same)
    assert paid_sub_reward(True, 1, None, (0.1, 0.4, 0.7)) == paid_sub_reward(True, 1, 0.0, (0.1, 0.4, 0.7)) == 0.1 + 0.4


def _same_type_misdelegation(scenario):
    """A chain task, its second hop asked about another entity of the first hop's answer's type."""
    graph = scenario.graph()
    by_name = {e.name: e for e in graph.entities}
    for task in scenario.tasks("stage2/train"):
        if task.kind != "chain":
            continue
        hop = task.hops[1]
        subject = by_name[hop.entity]
        for other in graph.entities:
            answer = graph.answer(other, hop.relation) if other.type == subject.type and other.name != hop.entity else None
            if answer and answer != hop.answer and other.name not in hop.question:
                return task, hop.question.replace(hop.entity, other.name), answer
    raise AssertionError("no chain task with a same-type entity")


def test_expert_score_against_the_delegated_subtask(small_scenario):
    task, subtask, right = _same_type_misdelegation(small_scenario)
    assert small_scenario.subtask_answer(task, subtask) == right
    by_subtask = expert_scorer(reference="subtask", scenario=small_scenario)
    # the sub-agent answered what it was asked: the paper's score blames it, the subtask score does not
    assert hop_expert_score(task, subtask, right) < 1.0 and by_subtask(task, subtask, right) == 1.0
    assert by_subtask(task, subtask, task.hops[1].answer) < 1.0  # the hop's answer is not what was asked
    # a subtask that is no hop of the question falls back to the hop score, and says so
    fell_back = by_subtask(task, "Who painted the sky?", task.hops[0].answer)
    assert fell_back == hop_expert_score(task, "Who painted the sky?", task.hops[0].answer)
    assert fell_back.source == SUBTASK_FELL_BACK == "subtask>hops"
    assert small_scenario.subtask_answer(task, task.hops[0].question) == task.hops[0].answer
    assert small_scenario.subtask_answer(task, task.hops[1].question.replace(task.hops[1].entity, "Nobody Atall")) is None
    assert by_subtask.source == "subtask" and expert_scorer().source == "hops"
    with pytest.raises(ValueError, match="expert reference"):
        expert_scorer(reference="answer")


def test_env_pays_the_gated_reward(small_scenario, small_world):
    """A wrong report paid by the env: b1 under the paper, 0 with the gate; a right one alike."""
    from mgrpo_env.rollout import collect
    from mgrpo_env.teacher import teacher_policies

    tasks = list(small_scenario.tasks("stage1/train"))[:8]
    policies = teacher_policies(small_scenario, ("main", "sub"), {"report_without_visit": 0.5}, seed=0)
    paid = {}
    for gate in (False, True):
        records = collect(small_scenario, tasks, 1, policies, world=small_world, seed=0,
                          env_kwargs={"rewards": RewardConfig(sub_format_gate=gate)})
        paid[gate] = [(s.expert, s.format_ok, r.correct, s.reward) for r in records for s in r.subs]
    assert [p[:3] for p in paid[False]] == [p[:3] for p in paid[True]]  # the same episodes
    wrong = [(a, b) for a, b in zip(paid[False], paid[True], strict=True) if a[0] == 0.0 and a[1]]
    assert wrong and all(a[3] == pytest.approx(0.1 + 0.4 * a[2]) and b[3] == pytest.approx(0.4 * b[2]) for a, b in wrong)
    right = [(a, b) for a, b in zip(paid[False], paid[True], strict=True) if a[0] == 1.0]
    assert right and all(a[3] == pytest.approx(b[3]) for a, b in right)


def test_config_fields_are_checked():
    from mgrpo_algo.core.config import load_config

    cfg = load_config(None, ["sub_format_gate=true", "expert_reference=subtask"])
    assert cfg.sub_format_gate and cfg.expert_reference == "subtask"
    with pytest.raises(ValueError, match="expert_reference"):
        load_config(None, ["expert_reference=answer"])
    # a scenario that cannot answer subtasks: refused as the config loads, in one line (not paid as 'hop')
    for name in ("qa-file", "gaia"):
        with pytest.raises(ValueError) as refused:
            load_config(None, [f"scenario={name}", "expert_reference=subtask"])
        assert str(refused.value) == (f"config field 'expert_reference' 'subtask' needs a scenario that answers "
                                      f"subtasks (subtask_answer); {name!r} has none: use 'hop'")
    assert load_config(None, ["scenario=qa-file"]).expert_reference == "hop"
    with pytest.raises(ValueError, match=r"warm_start.teacher.<mistake>.rate"):
        load_config(None, ["warm_start.teacher.answer_early.rate=1.5"])
    with pytest.raises(ValueError, match="roles"):
        load_config(None, ["warm_start.teacher.report_without_visit.roles={planner: 0.1}"])
    taught = load_config(None, ["warm_start.teacher.answer_early.rate=0.3",
                                "warm_start.teacher.answer_early.question_kinds={comparison: 0}"]).warm_start.teacher
    assert taught.enabled and set(taught.rates()) == {"answer_early"}
    assert taught.rates()["answer_early"].for_("main", "comparison") == 0.0
    assert not load_config(None, []).warm_start.teacher.enabled


def test_paired_ratio_difference_by_hand():
    from mgrpo_algo.experiments.intervals import paired_ratio_difference

    before = {"a": (2, 4), "b": (1, 2), "c": (0, 2)}
    after = {"a": (1, 4), "b": (0, 2), "c": (0, 2)}
    r = paired_ratio_difference(after, before, seed=0)
    assert r["diff"] == pytest.approx(1 / 8 - 3 / 8) and r["questions"] == 3.0
    assert r["low"] <= r["diff"] <= r["high"] <= 0.0  # no resample can raise the rate
    assert paired_ratio_difference({"a": (0, 0)}, before) is None  # no decision on one side
    same = paired_ratio_difference(before, before)
    assert same["diff"] == same["low"] == same["high"] == 0.0
    # a question only one side saw counts (0, 0) on the other
    assert paired_ratio_difference({"a": (1, 2)}, {"b": (0, 2)})["diff"] == pytest.approx(0.5)


def test_a_scorer_for_a_scenario_without_subtask_answers_is_refused(small_scenario):
    """The env's own check, for what the config cannot tell (a plug-in factory, a caller that hands the
    scorer the scenario's name instead of the scenario): an error, never the hop's score in silence."""
    from mgrpo_algo.core.config import load_config
    from mgrpo_algo.training.trainer import reward_config

    cfg = load_config(None, ["expert_reference=subtask"])
    for not_a_scenario in ("wiki-hops", object()):
        with pytest.raises(TypeError, match=r"^expert_reference 'subtask' needs a scenario that answers subtasks"):
            reward_config(cfg, not_a_scenario)
    assert reward_config(cfg, small_scenario).expert.source == "subtask"
