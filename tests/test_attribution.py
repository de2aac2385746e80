"""Which role lost each answer (mgrpo_env.attribution): outcomes and delegation figures counted by hand."""

from __future__ import annotations

import pytest

from mgrpo_algo.experiments import intervals as iv
from mgrpo_algo.experiments.attribution_stats import attribution_summary
from mgrpo_algo.experiments.report_attribution import attribution_checks, attribution_section
from mgrpo_env.attribution import (
    attribution_counts,
    attribution_counts_by_question,
    attribution_rates,
    episode_outcome,
    first_wrong_turn,
    supports_attribution,
)
from mgrpo_scenarios import DelegationMatch, Hop, Task
from mgrpo_scenarios.wiki_hops import WikiHops

# a 3-hop aggregation: two lookups, then a count
CHAIN = Task("q-agg", "How many people were born in the birthplace of the founder of Velmora Press?", "5",
             kind="aggregation", hops=(
                 Hop("Who founded Velmora Press?", "Orvel Dunmarch", "Velmora Press", "founder"),
                 Hop("Where was Orvel Dunmarch born?", "Ashgrove", "Orvel Dunmarch", "born_in"),
                 Hop("How many people were born in Ashgrove?", "5", "Ashgrove", "people_born")),
             metadata={"chains": [[0, 1, 2]], "combine": "last"})
# a comparison: two chains of one hop each
COMPARE = Task("q-cmp", "Which was founded earlier, Ashgrove or Brelmouth?", "Ashgrove", kind="comparison", hops=(
    Hop("In what year was Ashgrove founded?", "1204", "Ashgrove", "founded"),
    Hop("In what year was Brelmouth founded?", "1377", "Brelmouth", "founded")),
    metadata={"chains": [[0], [1]], "combine": "min"})


@pytest.fixture(scope="module")
def scenario(tmp_path_factory):
    # match_delegation and hop_answered read only the task: no world is built
    return WikiHops(seed=0, num_entities=300, profile="tiny", data_dir=tmp_path_factory.mktemp("w"))


def _record(task: Task, subs: list[tuple[str, str | None]], final: str | None, correct: bool = False) -> dict:
    return {"task": task.to_dict(), "correct": correct, "main": {"role": "main", "final": final},
            "subs": [{"task": t, "final": f} for t, f in subs]}


def test_wiki_hops_matches_a_delegation_to_a_hop_or_says_why_not(scenario):
    assert supports_attribution(scenario)
    assert scenario.match_delegation(CHAIN, "who founded velmora press") == DelegationMatch(0)  # case, punctuation
    assert scenario.match_delegation(CHAIN, "How many people were born in Ashgrove?") == DelegationMatch(2)
    # the right entity, another relation
    assert scenario.match_delegation(CHAIN, "In what year was Velmora Press founded?") == DelegationMatch(None, "other_relation")
    # a hop's question about a name no hop has (a chained hop asked about a wrong report)
    assert scenario.match_delegation(CHAIN, "Where was Ulla Varn born?") == DelegationMatch(None, "other_entity")
    # a hop's template about another hop's entity is another entity, not another relation
    assert scenario.match_delegation(CHAIN, "Where was Ashgrove born?") == DelegationMatch(None, "other_entity")
    assert scenario.hop_answered(CHAIN, 2, "five") and scenario.hop_answered(CHAIN, 2, " 5.")
    assert not scenario.hop_answered(CHAIN, 2, "6") and not scenario.hop_answered(CHAIN, 1, "Ashgrove Hall")
    with pytest.raises(ValueError, match="hop or a miss"):
        DelegationMatch(None, "")


@pytest.mark.parametrize(("subs", "final", "correct", "outcome"), [
    ([("Who founded Velmora Press?", "Orvel Dunmarch"), ("Where was Orvel Dunmarch born?", "Ashgrove"),
      ("How many people were born in Ashgrove?", "5")], "5", True, "right"),
    ([("Who founded Velmora Press?", "Orvel Dunmarch")], None, False, "no_answer"),
    # every hop reported right, the answer is a report of the wrong hop
    ([("Who founded Velmora Press?", "Orvel Dunmarch"), ("Where was Orvel Dunmarch born?", "Ashgrove"),
      ("How many people were born in Ashgrove?", "5")], "Ashgrove", False, "main_combine"),
    # the count never asked (the main agent asked another relation of the right entity instead)
    ([("Who founded Velmora Press?", "Orvel Dunmarch"), ("Where was Orvel Dunmarch born?", "Ashgrove"),
      ("What is the population of Ashgrove?", "12000")], "12000", False, "main_not_asked"),
    # hop 1 asked and reported wrong: the chain's later hops follow the wrong name, but hop 1 is the loss
    ([("Who founded Velmora Press?", "Orvel Dunmarch"), ("Where was Orvel Dunmarch born?", "Brelmouth"),
      ("How many people were born in Brelmouth?", "2")], "2", False, "sub_wrong"),
    ([("Who founded Velmora Press?", None)], "0", False, "sub_no_result"),
    # asked twice: one ran out of turns, one reported a wrong name: a wrong report, not a missing one
    ([("Who founded Velmora Press?", None), ("Who founded Velmora Press?", "Ulla Varn")], "Ulla Varn", False, "sub_wrong"),
])
def test_each_episode_gets_the_outcome_of_its_first_loss(scenario, subs, final, correct, outcome):
    got, _ = episode_outcome(_record(CHAIN, subs, final, correct), scenario)
    assert got == outcome


def test_a_comparison_with_both_years_reported_and_a_third_name_is_the_main_agents_loss(scenario):
    subs = [("In what year was Ashgrove founded?", "1204"), ("In what year was Brelmouth founded?", "1377")]
    assert episode_outcome(_record(COMPARE, subs, "Orvel Dunmarch"), scenario)[0] == "main_combine"
    # the second chain's hop never asked, the first asked twice
    subs = [("In what year was Ashgrove founded?", "1204"), ("In what year was Ashgrove founded?", "1204")]
    assert episode_outcome(_record(COMPARE, subs, "Ashgrove", True), scenario)[0] == "right"
    assert episode_outcome(_record(COMPARE, subs, "Brelmouth"), scenario)[0] == "main_not_asked"


def test_counts_of_one_episode_by_hand(scenario):
    subs = [("Who founded Velmora Press?", "Orvel Dunmarch"),          # asks hop 0, right
            ("In what year was Velmora Press founded?", "1801"),       # other relation
            ("Where was Orvel Dunmarch born?", None),                  # asks hop 1, no result
            ("Where was Ulla Varn born?", "Ashgrove")]                 # other entity (its report is hop 1's answer)
    counts = attribution_counts(_record(CHAIN, subs, "Ashgrove"), scenario)
    # hop 1 was reported right (by the other-entity delegation), hop 2 was never asked
    assert counts["outcome/main_not_asked"] == (1, 1) and counts["outcome/right"] == (0, 1)
    assert counts["outcome/aggregation/main_not_asked"] == (1, 1)
    assert counts["delegation/asks_hop"] == (2, 4)
    assert counts["delegation/other_relation"] == (1, 4) and counts["delegation/other_entity"] == (1, 4)
    assert counts["exact_hop/right"] == (1, 2) and counts["exact_hop/no_result"] == (1, 2)
    assert counts["exact_hop/right/founder"] == (1, 1) and counts["exact_hop/right/born_in"] == (0, 1)
    assert "exact_hop/right/people_born" not in counts
    single = {"task": CHAIN.to_dict(), "correct": False, "main": {"role": "single", "final": "x"}, "subs": []}
    assert attribution_counts(single, scenario) == {}


def test_rates_pool_per_question_and_the_delegation_share_averages_questions(scenario):
    records = [
        _record(CHAIN, [("Who founded Velmora Press?", "Orvel Dunmarch")], None),                    # 1 of 1 asks a hop
        _record(CHAIN, [("Who founded Velmora Press?", "Orvel Dunmarch"), ("Where was Ulla Varn born?", "x"),
                        ("Where was Ulla Varn born?", "x")], "x"),                                     # 1 of 3
        _record(COMPARE, [("In what year was Ulla Varn born?", "1")] * 4, "x"),                      # 0 of 4
    ]
    counts = attribution_counts_by_question(records, scenario)
    assert counts["q-agg"]["delegation/asks_hop"] == [2, 4] and counts["q-cmp"]["delegation/asks_hop"] == [0, 4]
    rates = attribution_rates(counts)
    assert rates["delegation/asks_hop"] == pytest.approx(2 / 8)                    # pooled
    assert rates["delegation/asks_hop_per_question"] == pytest.approx((2 / 4 + 0 / 4) / 2)
    assert rates["outcome/no_answer"] == pytest.approx(1 / 3) and rates["episodes"] == 3.0
    assert attribution_counts_by_question(records, object()) == {}  # a scenario without the hook: no figures


def test_the_per_question_mean_change_and_its_interval():
    after = {"q1": (3, 4), "q2": (1, 1), "q3": (0, 2)}
    before = {"q1": (1, 4), "q2": (0, 1), "q3": (0, 0)}  # q3 has no delegation before: not paired
    r = iv.paired_mean_ratio_difference(after, before, seed=0)
    assert r["diff"] == pytest.approx(((3 / 4 - 1 / 4) + (1 - 0)) / 2) and r["questions"] == 2.0
    assert r["low"] <= r["diff"] <= r["high"] and r["low"] == pytest.approx(0.5) and r["high"] == pytest.approx(1.0)
    assert iv.paired_mean_ratio_difference({"q": (1, 2)}, {"q": (0, 0)}) is None


def _summary(start_share: tuple[int, int], after_share: tuple[int, int], agg_after: int) -> dict:
    # 20 questions, each with the same counts: an interval of zero width around the change
    start = {f"q{i}": {"delegation/asks_hop": start_share, "outcome/right": (0, 1), "outcome/aggregation/right": (0, 1)}
             for i in range(20)}
    after = {f"q{i}": {"delegation/asks_hop": after_share, "outcome/right": (agg_after, 1),
                       "outcome/aggregation/right": (agg_after, 1)} for i in range(20)}
    return {"attribution": {"mgrpo": attribution_summary(start, after, seed=0)}}


def test_the_planner_checks_pass_only_above_zero_and_the_target():
    passed = {c["check"]: c["passed"] for c in attribution_checks(_summary((2, 3), (5, 6), 1))}
    assert list(passed.values()) == [True, True]
    low = {c["check"]: c["passed"] for c in attribution_checks(_summary((2, 3), (7, 9), 0))}  # up, but 77.8% < 80%
    assert list(low.values()) == [False, False]
    assert attribution_checks({"attribution": {}}) == []


def test_the_report_section_lists_every_outcome_per_mode_and_kind(scenario):
    records = [_record(CHAIN, [("Who founded Velmora Press?", "Orvel Dunmarch")], None),
               _record(COMPARE, [("In what year was Ashgrove founded?", "1204"),
                                 ("In what year was Brelmouth founded?", "1377")], "Ashgrove", True)]
    counts = attribution_counts_by_question(records, scenario)
    summary = {"attribution": {"mgrpo": attribution_summary(counts, counts, seed=0)},
               "reference": {"name": "oracle-warm-start", "attribution": attribution_rates(counts)}}
    text = "\n".join(attribution_section(summary))
    assert "| mgrpo | right | 50.0 | 50.0 | +0.0 [+0.0, +0.0] | 50.0 |" in text
    assert "| mgrpo | no answer (main) | 50.0 | 50.0 |" in text
    assert "| mgrpo | aggregation | 0.0 -> 0.0 | 100.0 -> 100.0 |" in text
    assert "| founded | founder |" in text and "100.0 -> 100.0 | 100.0 -> 100.0 |" in text
    assert attribution_section({}) == []


def _episode(task: Task, subs: list[tuple[str, str | None, int]], final: str | None, correct: bool = False,
             named: bool = True) -> dict:
    """A record with turns: the main agent delegates each subtask in turn (sub_i, ``n`` turns, the last its
    result), then answers ``final`` (or breaks the format when None)."""
    calls = [{"action": "", "kind": "tool_call", "tool_call": {"tool": "delegate", "arguments": {"task": t}, "ok": True,
                                                                 "meta": {"agent": f"sub_{i}"} if named else {}}}
             for i, (t, _, _) in enumerate(subs)]
    main = {"agent": "main_0", "role": "main", "final": final,
            "turns": [*calls, {"action": "", "kind": "answer" if final is not None else "error"}]}
    agents = [{"agent": f"sub_{i}", "role": "sub", "task": t, "final": f,
               "turns": [{"action": "", "kind": "tool_call"}] * (n - 1) + [{"action": "", "kind": "result"}] * (n > 0)}
              for i, (t, f, n) in enumerate(subs)]
    return {"task": CHAIN.to_dict() if task is CHAIN else task.to_dict(), "correct": correct, "main": main, "subs": agents,
            "end_reason": "answer" if final is not None else "main_turn_limit"}


HOP0, HOP1, HOP2 = "Who founded Velmora Press?", "Where was Orvel Dunmarch born?", "How many people were born in Ashgrove?"


@pytest.mark.parametrize(("subs", "final", "mark"), [
    # the second delegation asks another relation (turn 1); hop 2 is then never asked
    ([(HOP0, "Orvel Dunmarch", 2), ("In what year was Velmora Press founded?", "1801", 2), (HOP1, "Ashgrove", 2)],
     "1801", ("main_not_asked", "main_0", 1, "asked no hop of the task (other relation)")),
    # every delegation asks a hop, hop 1 is never asked: the answer (turn 1) is the loss
    ([(HOP0, "Orvel Dunmarch", 2)], "Orvel Dunmarch",
     ("main_not_asked", "main_0", 1, "never asked the needed hop 1: 'Where was Orvel Dunmarch born?'")),
    # sub_1 reports hop 1 wrong in its third turn
    ([(HOP0, "Orvel Dunmarch", 2), (HOP1, "Brelmouth", 3), ("How many people were born in Brelmouth?", "2", 2)], "2",
     ("sub_wrong", "sub_1", 2, "reported hop 1 wrong: 'Brelmouth' (gold 'Ashgrove')")),
    # hop 0 asked twice: sub_0 ran out of turns (its 2nd), sub_1 too; the first is marked
    ([(HOP0, None, 2), (HOP0, None, 3)], "x", ("sub_no_result", "sub_0", 1, "no result for hop 0: 'Who founded Velmora Press?'")),
    # a sub-agent without turns: the main agent's delegation to it (turn 1)
    ([(HOP0, "Orvel Dunmarch", 1), (HOP1, None, 0)], "x", ("sub_no_result", "main_0", 1,
                                                            "no result for hop 1: 'Where was Orvel Dunmarch born?'")),
    # every hop right, a wrong answer in the main agent's last turn (3)
    ([(HOP0, "Orvel Dunmarch", 1), (HOP1, "Ashgrove", 1), (HOP2, "5", 1)], "Ashgrove",
     ("main_combine", "main_0", 3, "failed to combine: every hop was reported right, the answer is wrong")),
    ([(HOP0, "Orvel Dunmarch", 1)], None,
     ("no_answer", "main_0", 1, "no answer: the main agent ended without one (main_turn_limit)")),
])
def test_the_first_wrong_turn_of_each_outcome_by_hand(scenario, subs, final, mark):
    got = first_wrong_turn(_episode(CHAIN, subs, final), scenario)
    assert (got.outcome, got.agent, got.turn, got.why) == mark


def test_no_wrong_turn_when_right_single_or_without_hops_and_delegations_matched_without_names(scenario):
    right = _episode(CHAIN, [(HOP0, "Orvel Dunmarch", 1), (HOP1, "Ashgrove", 1), (HOP2, "5", 1)], "5", correct=True)
    assert first_wrong_turn(right, scenario) is None
    single = {**right, "correct": False, "main": {**right["main"], "role": "single"}}
    assert first_wrong_turn(single, scenario) is None
    no_hops = {**right, "correct": False, "task": {**right["task"], "hops": []}}
    assert first_wrong_turn(no_hops, scenario) is None
    # records from before tool calls named their sub-agent: the delegations are matched in order
    old = _episode(CHAIN, [(HOP0, "Orvel Dunmarch", 2), ("Where was Ulla Varn born?", "x", 2)], "x", named=False)
    got = first_wrong_turn(old, scenario)
    assert (got.outcome, got.agent, got.turn) == ("main_not_asked", "main_0", 1)
