"""The decision-mistake statistics by hand, on small records whose answers are known: the counts of each
record (episodes cut off at a turn limit with hops left among them, the delegation cap, reports without
a result), the rates pooled over questions, the direction of every change (after - start) and its
paired interval, and the pooling of seeds' counts per question."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest

from mgrpo_algo.experiments import intervals as iv
from mgrpo_algo.experiments.mistake_stats import mistake_changes, pool_counts
from mgrpo_env.episode import AgentTrajectory, EpisodeRecord, ToolCall, Turn
from mgrpo_env.mistakes import (
    ENDING_RATE_KEYS,
    MISTAKE_RATE_KEYS,
    add_counts,
    mistake_rates,
    rates_of_counts,
)
from mgrpo_env.mistakes import counts_by_question as _all_by_question
from mgrpo_env.mistakes import record_counts as _all_counts


# The decision mistakes only: how episodes end (ENDING_RATE_KEYS) is tested in tests/test_endings.py.
def record_counts(*args, **kwargs):
    return {k: v for k, v in _all_counts(*args, **kwargs).items() if k not in ENDING_RATE_KEYS}


def counts_by_question(*args, **kwargs):
    return {q: {k: v for k, v in c.items() if k not in ENDING_RATE_KEYS} for q, c in _all_by_question(*args, **kwargs).items()}


def _turn(kind, tool=None, **arguments):
    return {"kind": kind, "tool_call": {"tool": tool, "arguments": arguments} if tool else None}


D, A = _turn("tool_call", "delegate"), _turn("answer")


def _hierarchy(qid, hops, main_turns, subs=()):
    return {"task": {"id": qid, "hops": [{}] * hops}, "main": {"role": "main", "turns": main_turns},
            "subs": [{"final": final, "turns": [_turn("tool_call", t) for t in tools]} for final, tools in subs]}


def _single(qid, hops, turns):
    return {"task": {"id": qid, "hops": [{}] * hops}, "main": {"role": "single", "turns": turns}}


def test_hierarchy_counts_by_hand():
    # cut off at the turn limit after 2 of 3 delegations: two decisions with hops left, no early answer, and
    # the episode did not answer, so it is not an early-answer episode; a sub-agent without a result is no report
    cut = _hierarchy("q1", 3, [D, D], [("x", ["search", "visit"]), (None, ["search"])])
    assert record_counts(cut) == {"answer_early": (0, 2), "answer_early_episodes": (0, 1),
                                  "report_without_visit": (0, 1), "delegations": (2, 1)}
    # answered at once with 2 hops left
    assert record_counts(_hierarchy("q1", 2, [A])) == {"answer_early": (1, 1), "answer_early_episodes": (1, 1),
                                                       "report_without_visit": (0, 0), "delegations": (0, 1)}
    # three delegations for two hops: the third is no decision with hops left, nor is the answer after it;
    # two of three reports made without a visit (a repeated search is still no visit)
    over = _hierarchy("q2", 2, [D, D, D, A], [("a", ["search"]), ("b", ["search", "search"]), ("c", ["visit"])])
    assert record_counts(over) == {"answer_early": (0, 2), "answer_early_episodes": (0, 1),
                                   "report_without_visit": (2, 3), "delegations": (3, 1)}
    # 5 hops capped at max_delegations: 1 delegation then an answer with hops left; a report with no tool call
    capped = _hierarchy("q3", 5, [D, A], [("y", [])])
    assert record_counts(capped, max_delegations=3) == {"answer_early": (1, 2), "answer_early_episodes": (1, 1),
                                                        "report_without_visit": (1, 1), "delegations": (1, 1)}
    assert record_counts(capped, max_delegations=1)["answer_early"] == (0, 1)  # no hop left after one delegation
    # a question without hops: nothing is left to delegate, an answer is no mistake
    assert record_counts({"task": {"id": "q4", "hops": None}, "main": {"role": "main", "turns": [A]}})["answer_early"] == (0, 0)


def test_single_agent_counts_by_hand():
    search = lambda name: _turn("tool_call", "search", queries=[name])  # noqa: E731
    visit = _turn("tool_call", "visit", url="u")
    # cut off while on its third hop (C): A and B were left after a visit; the hop it was on is not closed.
    # A visit before any search belongs to no hop; a quoted retry of A is the same hop.
    cut = _single("s1", 3, [visit, search("A"), search('"A"'), visit, search("B"), visit, search("C")])
    assert record_counts(cut) == {"answer_early_episodes": (0, 1), "report_without_visit": (0, 2)}
    # both hops left without a visit, then an answer after every hop: not early
    assert record_counts(_single("s2", 2, [search("A"), search("B"), A])) == {
        "answer_early_episodes": (0, 1), "report_without_visit": (2, 2)}
    # answered before any hop: early
    assert record_counts(_single("s3", 3, [A])) == {"answer_early_episodes": (1, 1), "report_without_visit": (0, 0)}
    # answered on its second of three hops, which it visited
    assert record_counts(_single("s4", 3, [search("A"), search("B"), visit, A])) == {
        "answer_early_episodes": (1, 1), "report_without_visit": (1, 2)}
    rates = mistake_rates([cut, _single("s3", 3, [A])])
    assert rates["answer_early"] is None and rates["delegations"] is None  # no main decision in a single agent
    assert rates["answer_early_episodes"] == 0.5 and rates["report_without_visit"] == 0.0
    assert (rates["episodes"], rates["main_decisions"], rates["sub_reports"]) == (2.0, 0.0, 2.0)


def test_records_as_objects_count_as_their_dicts():
    """EpisodeRecord objects (to_dict) and plain objects holding trajectories (attributes) count alike."""
    def traj(agent, role, calls, final=None, answer=False):
        turns = [Turn("x", "tool_call", tool_call=ToolCall(t, {"queries": [q]} if q else {}, True)) for t, q in calls]
        return AgentTrajectory(agent, role, turns=turns + ([Turn("x", "answer")] if answer else []), final=final)

    main = traj("main_0", "main", [("delegate", None)], answer=True)
    subs = [traj("sub_0", "sub", [("search", "A")], final="r"), traj("sub_1", "sub", [("search", "A"), ("visit", None)]),
            traj("sub_2", "sub", [("search", "B"), ("visit", None)], final="s")]
    record = EpisodeRecord("e", {"id": "q", "hops": [{}, {}, {}]}, main=main, subs=subs)
    expected = {"answer_early": (1, 2), "answer_early_episodes": (1, 1), "report_without_visit": (1, 2),
                "delegations": (1, 1)}
    assert record_counts(record) == expected
    assert record_counts(SimpleNamespace(task=record.task, main=main, subs=subs)) == expected
    single = traj("single_0", "single", [("search", "A"), ("visit", None), ("search", "B")], answer=True)
    assert record_counts(SimpleNamespace(task={"id": "s", "hops": [{}, {}]}, main=single, subs=[])) == {
        "answer_early_episodes": (0, 1), "report_without_visit": (1, 2)}


def test_rates_pool_every_question_and_none_where_nothing_is_counted():
    records = [_hierarchy("q1", 3, [D, D]), _hierarchy("q1", 2, [A]),
               _hierarchy("q2", 2, [D, D, D, A], [("a", ["search"]), ("c", ["visit"])])]
    by_question = counts_by_question(records)
    assert by_question == {
        "q1": {"answer_early": [1, 3], "answer_early_episodes": [1, 2], "report_without_visit": [0, 0], "delegations": [2, 2]},
        "q2": {"answer_early": [0, 2], "answer_early_episodes": [0, 1], "report_without_visit": [1, 2], "delegations": [3, 1]},
    }
    rates = rates_of_counts(by_question)
    # pooled over questions (1 + 0) / (3 + 2), not the mean of the questions' rates (1/3 + 0) / 2
    assert rates["answer_early"] == pytest.approx(1 / 5)
    assert rates["answer_early_episodes"] == pytest.approx(1 / 3)
    assert rates["report_without_visit"] == pytest.approx(1 / 2)
    assert rates["delegations"] == pytest.approx(5 / 3)
    assert (rates["episodes"], rates["main_decisions"], rates["sub_reports"]) == (3.0, 5.0, 2.0)
    assert rates_of_counts({}) == {**dict.fromkeys((*MISTAKE_RATE_KEYS, "delegations", *ENDING_RATE_KEYS)), "episodes": 0.0,
                                   "main_decisions": 0.0, "sub_reports": 0.0}
    assert counts_by_question([_hierarchy("q", 4, [D, A])], max_delegations=1)["q"]["answer_early"] == [0, 1]
    into = {"answer_early": [1, 2]}
    assert add_counts(into, {"answer_early": (2, 3), "delegations": (1, 1)}) is into
    assert into == {"answer_early": [3, 5], "delegations": [1, 1]}


BEFORE = {"q1": {"answer_early": [2, 4], "report_without_visit": [1, 2]},
          "q2": {"answer_early": [1, 2], "report_without_visit": [0, 0]}}
AFTER = {"q1": {"answer_early": [0, 4], "report_without_visit": [2, 2]},
         "q2": {"answer_early": [0, 2]}}


def test_each_change_is_after_minus_start_with_its_interval():
    changes = mistake_changes(AFTER, BEFORE, seed=0)
    assert set(changes) == {*MISTAKE_RATE_KEYS, *ENDING_RATE_KEYS}
    assert all(changes[k] is None for k in ENDING_RATE_KEYS)  # neither side counted them
    # early answers fell from 3/6 to 0/6: -50 points, and every resample of the questions says so
    assert changes["answer_early"] == {"diff": -0.5, "low": -0.5, "high": -0.5, "questions": 2.0, "confidence": 0.95}
    # reports without a visit rose from 1/2 to 2/2 (q2 has no report on either side)
    assert changes["report_without_visit"]["diff"] == pytest.approx(0.5)
    assert changes["report_without_visit"]["low"] == changes["report_without_visit"]["high"] == pytest.approx(0.5)
    assert changes["answer_early_episodes"] is None  # neither side counted it


def test_a_change_interval_is_the_paired_bootstrap_of_its_counts_with_the_seed_given():
    before = {f"q{i}": {"answer_early": [i % 3, 2 + i % 5]} for i in range(12)}
    after = {f"q{i}": {"answer_early": [(i * 7) % 4 // 2, 2 + (i * 3) % 4]} for i in range(12)}
    pairs = ({q: c["answer_early"] for q, c in after.items()}, {q: c["answer_early"] for q, c in before.items()})
    for seed in (0, 5):
        got = mistake_changes(after, before, seed=seed)["answer_early"]
        assert got == iv.paired_ratio_difference(*pairs, seed=seed)
        assert got["low"] < got["diff"] < got["high"]
    assert mistake_changes(after, before, seed=0)["answer_early"] != mistake_changes(after, before, seed=5)["answer_early"]
    after_rate = sum((i * 7) % 4 // 2 for i in range(12)) / sum(2 + (i * 3) % 4 for i in range(12))
    before_rate = sum(i % 3 for i in range(12)) / sum(2 + i % 5 for i in range(12))
    assert got["diff"] == pytest.approx(after_rate - before_rate) and got["diff"] < 0  # a fall: after - start


def test_pooling_seeds_sums_each_questions_counts_and_keeps_the_inputs():
    runs = [{"q1": {"answer_early": [1, 2]}},
            {"q1": {"answer_early": [0, 2], "report_without_visit": [1, 1]}, "q2": {"answer_early": [1, 1]}}]
    kept = copy.deepcopy(runs)
    pooled = pool_counts(runs)
    assert pooled == {"q1": {"answer_early": [1, 4], "report_without_visit": [1, 1]}, "q2": {"answer_early": [1, 1]}}
    assert runs == kept
    assert pool_counts([]) == {}
    # the pooled change is the change of the pooled counts: seed 0's and seed 1's questions as one
    assert mistake_changes(pool_counts([AFTER, AFTER]), pool_counts([BEFORE, BEFORE]), seed=0)["answer_early"]["diff"] == -0.5


def test_the_delegation_cap_defaults_to_three_and_reaches_the_rates():
    four = _hierarchy("q", 4, [D, D, D, A])  # three delegations, the cap: the answer has no hop left to delegate
    assert record_counts(four)["answer_early"] == (0, 3)
    assert counts_by_question([four])["q"]["answer_early"] == [0, 3]
    assert mistake_rates([four])["answer_early"] == 0.0
    assert mistake_rates([four], max_delegations=4)["answer_early"] == 0.25  # the cap given is the cap used
    assert mistake_rates([four], max_delegations=1)["answer_early"] == 0.0
    assert mistake_rates([_hierarchy("q", 4, [D, A])], max_delegations=2)["answer_early"] == 0.5
