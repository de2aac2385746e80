"""Turn-level credit outside the group standardisation (``TurnCredit``: a format penalty on the offending
turn, a likelihood term on successful trajectories) and the sub-agents' outcome groups per subtask, by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mgrpo_algo.core.config import TrainConfig
from mgrpo_algo.core.scoring import (
    CalledFact,
    CalledScoring,
    TurnCredit,
    credited_turns,
    penalised_turns,
    score_main_side,
    score_sub_side,
    sub_facts,
)
from mgrpo_env.episode import AgentTrajectory, EpisodeRecord, Turn

R2 = math.sqrt(2.0)


def _traj(kinds: list[str], final: str | None, agent: str = "main_0", role: str = "main", task: str | None = None,
          expert: float | None = None) -> AgentTrajectory:
    return AgentTrajectory(agent=agent, role=role, turns=[Turn(action=k, kind=k) for k in kinds], final=final,
                           format_ok="error" not in kinds and final is not None, task=task, expert=expert)


def test_penalised_turns_are_the_malformed_ones_and_the_last_of_an_agent_without_its_final():
    assert penalised_turns(_traj(["tool_call", "answer"], "x")) == ()
    assert penalised_turns(_traj(["tool_call", "error", "answer"], "x")) == (1,)
    # out of turns: its last turn, once even when it is malformed too
    assert penalised_turns(_traj(["tool_call", "tool_call", "tool_call"], None)) == (2,)
    assert penalised_turns(_traj(["error", "tool_call", "error"], None)) == (0, 2)
    assert penalised_turns(_traj([], None)) == ()
    # a trajectory as its JSON dict (turns unread): an error, not "no turn penalised" in silence
    with pytest.raises(AttributeError, match="turns"):
        penalised_turns(_traj(["error", "tool_call"], None).__dict__)


def test_credited_turns_adds_its_terms_after_the_standardised_ones():
    off = TurnCredit()
    assert credited_turns(0.5, None, 0.0, 3, (1,), 1.0, off) is None  # the paper: one advantage a trajectory
    assert credited_turns(0.5, [1.0, -1.0], 2.0, 2, (1,), 1.0, off) == (2.5, -1.5)  # step credit only, as before
    credit = TurnCredit(format_penalty=0.25, success_likelihood=0.5)
    # no step credit: the trajectory's advantage on every turn, -c on turn 1, +lam x success everywhere
    assert credited_turns(-1.0, None, 0.0, 3, (1,), 1.0, credit) == (-0.5, -0.75, -0.5)
    assert credited_turns(-1.0, None, 0.0, 3, (1,), 0.5, credit) == (-0.75, -1.0, -0.75)
    # with step credit: base + w x step, then the credit
    assert credited_turns(1.0, [1.0, 0.0], 0.5, 2, (0,), 0.0, credit) == (1.25, 1.0)
    with pytest.raises(ValueError, match="2 turn advantages for 3 turns"):
        credited_turns(1.0, [1.0, 0.0], 0.5, 3, (), 0.0, credit)
    with pytest.raises(ValueError, match="format_penalty must be a finite number >= 0"):
        TurnCredit(format_penalty=-0.1)
    with pytest.raises(ValueError, match="success_likelihood must be a finite number >= 0"):
        TurnCredit(success_likelihood=float("nan"))


def _main_records() -> list[EpisodeRecord]:
    """One query, K = 3: right; a well-formed wrong guess; a malformed turn then out of turns."""
    trajs = [_traj(["tool_call", "answer"], "A"), _traj(["answer"], "B"), _traj(["tool_call", "error", "tool_call"], None)]
    rewards = [1.0, 0.0, 0.0]
    return [EpisodeRecord(episode_id=f"e{i}", task={"id": "q"}, main=t, correct=bool(r), rewards={"main_0": r})
            for i, (t, r) in enumerate(zip(trajs, rewards, strict=True))]


def test_the_main_side_penalises_only_the_offending_turns_and_credits_only_success():
    records = _main_records()
    plain, _ = score_main_side(records, 3)
    # A_M of [1, 0, 0]: sqrt2, -1/sqrt2, -1/sqrt2
    assert [s.advantage for s in plain] == pytest.approx([R2, -1 / R2, -1 / R2])
    assert all(s.turn_advantages is None for s in plain)
    credited, metrics = score_main_side(records, 3, credit=TurnCredit(format_penalty=0.5, success_likelihood=0.25))
    assert [s.advantage for s in credited] == [s.advantage for s in plain]  # the standardised term is untouched
    assert credited[0].turn_advantages == pytest.approx((R2 + 0.25, R2 + 0.25))
    assert credited[1].turn_advantages == pytest.approx((-1 / R2,))  # a well-formed guess: neither term
    assert credited[2].turn_advantages == pytest.approx((-1 / R2, -1 / R2 - 0.5, -1 / R2 - 0.5))
    # the share of penalised turns per episode, averaged: 0, 0, 2/3
    assert metrics["main/penalised_turns"] == pytest.approx(2 / 9)


def test_a_format_penalty_never_makes_a_guess_worth_more_than_the_research_path():
    """In a group where nobody is right, the penalty orders a malformed turn below any well-formed one and
    leaves the well-formed guess and the well-formed research path equal (both 0)."""
    records = _main_records()
    for r in records:
        r.correct, r.rewards["main_0"] = False, 0.0
    credited, _ = score_main_side(records, 3, credit=TurnCredit(format_penalty=0.5))
    assert credited[0].turn_advantages == (0.0, 0.0) and credited[1].turn_advantages == (0.0,)
    assert credited[2].turn_advantages == (0.0, -0.5, -0.5)


def _sub_facts() -> list[list[CalledFact]]:
    """K = 4 rollouts of one query; rollouts 0-2 delegate subtask "a" (two right, one out of turns),
    rollout 3 subtask "b" (right)."""
    def rec(i: int, task: str, kinds: list[str], final: str | None, expert: float) -> EpisodeRecord:
        sub = _traj(kinds, final, agent="sub_0", role="sub", task=task, expert=expert)
        return EpisodeRecord(episode_id=f"e{i}", task={"id": "q"}, main=_traj(["answer"], "x"), subs=[sub])

    records = [rec(0, "a", ["tool_call", "result"], "v", 1.0), rec(1, "a", ["tool_call", "result"], "v", 1.0),
               rec(2, "a", ["tool_call", "error", "error"], None, 0.0), rec(3, "b", ["result"], "w", 1.0)]
    return sub_facts(records)


def test_sub_facts_carry_turns_penalised_turns_and_the_subtask():
    facts = _sub_facts()
    assert [row[0].turns for row in facts] == [2, 2, 3, 1]
    assert [row[0].penalised_turns for row in facts] == [(), (), (1, 2), ()]
    assert facts[0][0].subtask == facts[1][0].subtask == facts[2][0].subtask != facts[3][0].subtask


def _score_subs(facts, rewards, **kwargs):
    return score_sub_side(facts, rewards, 4, 1, strategy="duplicate", rng=np.random.default_rng(0), **kwargs)[0]


def test_sub_outcome_groups_per_subtask_compare_like_with_like():
    facts, rewards = _sub_facts(), [[1.0], [1.0], [0.0], [1.0]]
    pooled = _score_subs(facts, rewards)
    # the query's pool [1, 1, 0, 1]: mean 0.75, std sqrt(3)/4
    s = math.sqrt(3) / 4
    assert [x.advantage for x in pooled] == pytest.approx([0.25 / s, 0.25 / s, -0.75 / s, 0.25 / s])
    grouped = _score_subs(facts, rewards, outcome_groups="subtask")
    # subtask "a" alone: [1, 1, 0] -> 1/sqrt2, 1/sqrt2, -sqrt2; "b" has no peer and keeps its pooled A_S
    assert [x.advantage for x in grouped] == pytest.approx([1 / R2, 1 / R2, -R2, 0.25 / s])
    # a subtask whose slots all scored the same gives 0, as any group without spread
    flat = _score_subs(facts, [[1.0], [1.0], [1.0], [0.0]], outcome_groups="subtask")
    assert [x.advantage for x in flat][:3] == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="outcome_groups must be one of"):
        _score_subs(facts, rewards, outcome_groups="hop")


def test_the_sub_side_penalises_its_failed_turns_and_credits_reports_by_expert_score():
    facts, rewards = _sub_facts(), [[1.0], [1.0], [0.0], [1.0]]
    pooled = [x.advantage for x in _score_subs(facts, rewards)]
    credited = _score_subs(facts, rewards, credit=TurnCredit(format_penalty=0.5, success_likelihood=0.25))
    assert credited[0].turn_advantages == pytest.approx((pooled[0] + 0.25,) * 2)
    assert credited[2].turn_advantages == pytest.approx((pooled[2], pooled[2] - 0.5, pooled[2] - 0.5))
    assert credited[3].turn_advantages == pytest.approx((pooled[3] + 0.25,))


def test_sub_scoring_reads_its_credit_back_from_a_queued_iteration():
    from dataclasses import asdict

    scoring = CalledScoring(4, 1, "duplicate", 0.0, (0.1, 0.4, 0.5), credit=TurnCredit(0.5, 0.25), outcome_groups="subtask")
    again = CalledScoring(**asdict(scoring))  # worker.json keeps it as plain JSON
    assert again == scoring and again.credit == TurnCredit(0.5, 0.25)
    assert CalledScoring(4, 1, "duplicate", 0.0, (0.1, 0.4, 0.5)).credit == TurnCredit()
    with pytest.raises(ValueError, match="outcome_groups must be one of"):
        CalledScoring(4, 1, "duplicate", 0.0, (0.1, 0.4, 0.5), outcome_groups="nope")


def test_the_config_checks_the_credit_fields():
    cfg = TrainConfig(turn_format_penalty=0.5, success_likelihood=0.1, sub_outcome_groups="subtask")
    assert (cfg.turn_format_penalty, cfg.success_likelihood, cfg.sub_outcome_groups) == (0.5, 0.1, "subtask")
    with pytest.raises(ValueError, match="turn_format_penalty"):
        TrainConfig(turn_format_penalty=-1.0)
    with pytest.raises(ValueError, match="success_likelihood"):
        TrainConfig(success_likelihood=float("inf"))
    with pytest.raises(ValueError, match="sub_outcome_groups"):
        TrainConfig(sub_outcome_groups="hop")


def test_no_credit_without_turns_and_no_success_without_a_well_formed_trajectory():
    """Edges the mutation run found untested (issue 43): a trajectory of unknown length (``turns`` 0) keeps
    one advantage; a right answer or a judged report reached through a malformed turn earns no likelihood
    term, nor does a report no judge scored; the share of penalised turns is per turn, by hand."""
    credit = TurnCredit(format_penalty=0.5, success_likelihood=0.25)
    assert credited_turns(0.5, None, 0.0, 0, (), 1.0, credit) is None
    # main, K = 2: right after a malformed turn (format not ok), and one malformed turn out of turns
    records = [EpisodeRecord(episode_id="e0", task={"id": "q"}, main=_traj(["error", "answer"], "A"), correct=True,
                             rewards={"main_0": 1.0}),
               EpisodeRecord(episode_id="e1", task={"id": "q"}, main=_traj(["error"], None), rewards={"main_0": 0.0})]
    slots, metrics = score_main_side(records, 2, credit=credit)
    # A_M of [1, 0]: +1, -1; no success term on the malformed right answer, -c on each malformed turn
    assert [s.turn_advantages for s in slots] == [pytest.approx((0.5, 1.0)), pytest.approx((-1.5,))]
    assert metrics["main/penalised_turns"] == pytest.approx((1 / 2 + 1 / 1) / 2)
    # sub, K = 3: a judged report with a malformed turn, a malformed one-turn sub-agent, a well-formed unjudged one
    facts = [[CalledFact("sub_0", False, 1.0, turns=2, penalised_turns=(1,))],
             [CalledFact("sub_0", False, None, turns=1, penalised_turns=(0,))],
             [CalledFact("sub_0", True, None, turns=1)]]
    slots, metrics = score_sub_side(facts, [[1.0], [0.0], [0.5]], 3, 1, strategy="duplicate",
                                    rng=np.random.default_rng(0), credit=credit)
    a = math.sqrt(1.5)  # A_S of [1, 0, 0.5]: mean 0.5, population std sqrt(1/6)
    assert [s.turn_advantages for s in slots] == [pytest.approx((a, a - 0.5)), pytest.approx((-a - 0.5,)),
                                                  pytest.approx((0.0,))]
    assert metrics["sub/penalised_turns"] == pytest.approx((1 / 2 + 1 / 1 + 0 / 1) / 3)
    # no sub-agent at all: every slot masked, the share 0 (not the mean of nothing)
    _, empty = score_sub_side([[], []], [[], []], 2, 1, strategy="duplicate", rng=np.random.default_rng(0),
                              credit=credit)
    assert empty["sub/penalised_turns"] == 0.0 and empty["align/num_masked_slots"] == 2.0


def test_a_subtask_two_slots_share_is_standardised_between_them():
    """``outcome_groups: subtask`` with a pair: two slots given the same subtask are compared with each
    other (+1 / -1), the two with a subtask of their own keep their pooled A_S."""
    facts = [[CalledFact("sub_0", True, 1.0, subtask=s)] for s in ("a", "a", "b", "c")]
    rewards = [[1.0], [0.0], [1.0], [1.0]]
    grouped = _score_subs(facts, rewards, outcome_groups="subtask")
    s = math.sqrt(3) / 4  # the query's pool [1, 0, 1, 1]: mean 0.75
    assert [x.advantage for x in grouped] == pytest.approx([1.0, -1.0, 0.25 / s, 0.25 / s])


def test_a_role_batch_brings_slots_or_facts_with_their_scoring():
    from mgrpo_algo.core.scoring import MainSlot, RoleBatch, RolloutKey

    scoring = CalledScoring(2, 1, "duplicate", 0.0, (0.1, 0.4, 0.5))
    slot = MainSlot(RolloutKey(0, 0, 0), "main_0", 1.0, 0.5, 1.0, True)
    facts = [[CalledFact("sub_0", True, 1.0)]]
    assert RoleBatch(slots=[slot]).scores_itself is False
    assert RoleBatch(facts=facts, scoring=scoring).scores_itself is True
    assert RoleBatch(slots=[slot], facts=facts, scoring=scoring).scores_itself is True
    message = r"^a role's batch brings slots, or facts with their scoring, or both$"
    for bad in ({}, {"facts": facts}, {"scoring": scoring}, {"slots": [slot], "facts": facts},
                {"slots": [slot], "scoring": scoring}):
        with pytest.raises(ValueError, match=message):
            RoleBatch(**bad)


def _delegating_record(subtasks: list[tuple[str, str | None]], answer: str, reward: float, correct: bool) -> EpisodeRecord:
    from mgrpo_env.episode import ToolCall
    from tests.test_attribution import CHAIN

    turns, subs = [], []
    for n, (subtask, report) in enumerate(subtasks):
        call = ToolCall("delegate", {"task": subtask}, ok=True, meta={"agent": f"sub_{n}"})
        turns.append(Turn(action=f"d{n}", kind="tool_call", tool_call=call))
        subs.append(AgentTrajectory(agent=f"sub_{n}", role="sub", final=report, task=subtask))
    turns.append(Turn(action="a", kind="answer"))
    main = AgentTrajectory(agent="main_0", role="main", turns=turns, final=answer, format_ok=True)
    return EpisodeRecord("e", CHAIN.to_dict(), main=main, subs=subs, correct=correct, rewards={"main_0": reward})


def test_delegations_are_judged_as_the_main_agent_could_know_them():
    from mgrpo_env.attribution import delegation_judgements

    record = _delegating_record([
        ("Who founded Velmora Press?", "Ulla Varn"),            # hop 0: needed (reported wrong, unknowable)
        ("Who founded Velmora Press?", "Ulla Varn"),            # hop 0 again after a result: not needed
        ("Where was Ulla Varn born?", None),                    # hop 1 about the reported name: needed
        ("Where was Ulla Varn born?", "Ashgrove"),              # no result came back before: still needed
        ("What is the population of Ashgrove?", "12"),          # another relation: not needed
        ("How many people were born in Ashgrove?", "5"),        # hop 2 about a reported name: needed
    ], "5", 1.0, True)
    assert delegation_judgements(record) == [1.0, 0.0, 1.0, 1.0, 0.0, 1.0, None]
    # a chained hop about a name nobody reported is not a hop the main agent could ask
    guess = _delegating_record([("Where was Orvel Dunmarch born?", "Ashgrove")], "x", 0.0, False)
    assert delegation_judgements(guess) == [0.0, None]


def test_the_delegation_credit_moves_only_the_delegating_turns():
    credit = TurnCredit(delegation=0.5)
    assert credited_turns(1.0, None, 0.0, 3, (), 0.0, credit, [1.0, 0.0, None]) == (1.5, 0.5, 1.0)
    with pytest.raises(ValueError, match="2 delegation judgements for 3 turns"):
        credited_turns(1.0, None, 0.0, 3, (), 0.0, credit, [1.0, None])
    # two rollouts of one question: the same outcome, one delegation needed and one not
    good = _delegating_record([("Who founded Velmora Press?", "Orvel Dunmarch")], "x", 0.0, False)
    bad = _delegating_record([("In what year was Velmora Press founded?", "1801")], "x", 0.0, False)
    slots, metrics = score_main_side([good, bad], 2, credit=credit)
    assert [s.advantage for s in slots] == [0.0, 0.0]  # no outcome spread
    assert [s.turn_advantages for s in slots] == [(0.5, 0.0), (-0.5, 0.0)]
    assert metrics["main/delegations_needed"] == 0.5
    assert score_main_side([good, bad], 2, credit=TurnCredit())[0][0].turn_advantages is None  # off: the paper
    assert "main/delegations_needed" not in score_main_side([good, bad], 2, credit=TurnCredit())[1]  # not judged
    # the config's weight reaches the credit (turn_credit reads delegation_credit)
    from mgrpo_algo.core.config import load_config
    from mgrpo_algo.core.scoring import turn_credit

    assert turn_credit(load_config(None, ["delegation_credit=0.3"])) == TurnCredit(delegation=0.3)
    # a delegation judged needed is w_d up, one judged not w_d down: (2 j - 1) x w_d, j in {0, 1}
    assert credited_turns(0.0, None, 0.0, 2, (), 0.0, TurnCredit(delegation=0.25), [1.0, 0.0]) == (0.25, -0.25)
    with pytest.raises(ValueError, match="delegation"):
        TurnCredit(delegation=-1.0)
