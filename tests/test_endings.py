"""How episodes end (mgrpo_env.mistakes ENDING_RATE_KEYS), the report's rows and checks on them, and the
held-out curve's points (compare.curve_point): by hand, on small records whose endings are known."""

from __future__ import annotations

import types

import pytest

from mgrpo_algo.experiments import report
from mgrpo_algo.experiments.compare import curve_point
from mgrpo_algo.experiments.mistake_stats import mistake_changes
from mgrpo_env.episode import AgentTrajectory, EpisodeRecord, Turn
from mgrpo_env.mistakes import ENDING_RATE_KEYS, counts_by_question, mistake_rates, record_counts


def _agent(kinds: list[str], final: str | None, role: str = "main", agent: str = "main_0") -> AgentTrajectory:
    return AgentTrajectory(agent=agent, role=role, turns=[Turn(action=k, kind=k) for k in kinds], final=final)


def _episode(qid: str, main: list[str], answered: bool, correct: bool, subs: list[tuple[list[str], bool]],
             seed: int = 0, role: str = "main") -> EpisodeRecord:
    return EpisodeRecord(
        episode_id=f"{qid}-{seed}", task={"id": qid, "answer": "Paris", "hops": [{}, {}]}, seed=seed,
        main=_agent(main, "Paris" if answered else None, role=role, agent=f"{role}_0"),
        subs=[_agent(k, "x" if done else None, role="sub", agent=f"sub_{i}") for i, (k, done) in enumerate(subs)],
        correct=correct, final_answer="Paris" if correct else ("Rome" if answered else None),
        end_reason="answer" if answered else ("turn_limit" if role == "single" else "main_turn_limit"))


def test_ending_counts_of_one_hierarchy_episode_by_hand():
    ep = _episode("q", ["tool_call", "error", "tool_call", "error", "tool_call"], answered=False, correct=False,
                  subs=[(["tool_call", "result"], True), (["tool_call", "tool_call", "error"], False)])
    counts = record_counts(ep)
    assert {k: counts[k] for k in ENDING_RATE_KEYS} == {
        "malformed_main_episodes": (1, 1), "malformed_main_turns": (2, 5), "malformed_sub_turns": (1, 5),
        "sub_no_result": (1, 2), "turn_limit_episodes": (1, 1), "answered_accuracy": (0, 0)}


def test_a_single_agent_has_no_sub_side_and_its_turn_limit_counts():
    ep = _episode("q", ["tool_call", "error"], answered=False, correct=False, subs=[], role="single")
    counts = record_counts(ep)
    assert "sub_no_result" not in counts and "malformed_sub_turns" not in counts
    assert counts["turn_limit_episodes"] == (1, 1) and counts["malformed_main_turns"] == (1, 2)


def test_rates_pool_over_episodes_and_the_answered_accuracy_counts_answered_ones_only():
    eps = [_episode("a", ["tool_call", "answer"], True, True, [(["tool_call", "result"], True)], seed=0),
           _episode("a", ["answer"], True, False, [], seed=1),
           _episode("b", ["error", "tool_call", "tool_call"], False, False, [(["error", "error", "error"], False)], seed=2)]
    rates = mistake_rates(eps)
    assert rates["answered_accuracy"] == pytest.approx(1 / 2)  # 1 right of 2 answered; b never answered
    assert rates["turn_limit_episodes"] == pytest.approx(1 / 3)
    assert rates["malformed_main_episodes"] == pytest.approx(1 / 3)
    assert rates["malformed_main_turns"] == pytest.approx(1 / 6)
    assert rates["sub_no_result"] == pytest.approx(1 / 2)
    assert rates["malformed_sub_turns"] == pytest.approx(3 / 5)
    by_q = counts_by_question(eps)
    assert by_q["a"]["answered_accuracy"] == [1, 2] and by_q["b"]["sub_no_result"] == [1, 1]


def test_the_changes_of_the_endings_carry_their_direction():
    """after - start of each ending rate: more malformed episodes after is a positive change."""
    start = counts_by_question([_episode(f"q{i}", ["tool_call", "answer"], True, False, [(["tool_call", "result"], True)])
                                for i in range(20)])
    after = counts_by_question([_episode(f"q{i}", ["error", "answer"], True, False, [(["tool_call", "error"], False)])
                                for i in range(20)])
    change = mistake_changes(after, start, seed=0)
    assert change["malformed_main_episodes"]["diff"] == pytest.approx(1.0)  # fractions: +100 points
    assert change["sub_no_result"]["diff"] == pytest.approx(1.0)
    assert mistake_changes(start, after, seed=0)["sub_no_result"]["diff"] == pytest.approx(-1.0)


def _summary(change: dict) -> dict:
    return {"mistakes": {"mgrpo": {"start": {}, "after": {}, "change": change}}}


@pytest.mark.parametrize(("low", "high", "passed"), [
    (-0.03, -0.01, True),   # fell
    (-0.02, +0.04, True),   # an interval that holds 0: not shown to rise
    (0.0, +0.04, True),     # touching 0 from above is still not above it
    (+0.005, +0.06, False),  # rose, the whole interval above 0
])
def test_each_ending_check_passes_only_when_its_interval_is_not_above_zero(low, high, passed):
    for kind in ("malformed_main_episodes", "sub_no_result"):
        other = "sub_no_result" if kind == "malformed_main_episodes" else "malformed_main_episodes"
        checks = report.ending_checks(_summary({kind: {"diff": (low + high) / 2, "low": low, "high": high},
                                                other: {"diff": -5.0, "low": -9.0, "high": -1.0}}))
        by_kind = {c["check"]: c["passed"] for c in checks}
        name = next(c for c in by_kind if report.ENDING_NAMES[kind] in c)
        assert by_kind[name] is passed, (kind, low, high)
        assert all(v is True for c, v in by_kind.items() if c != name)


def test_ending_checks_are_not_run_without_mgrpo_and_the_section_lists_each_mode():
    assert [c["passed"] for c in report.ending_checks({"mistakes": {}})] == [None, None]
    summary = {"mistakes": {"frozen-sub": {"start": {"sub_no_result": 0.2}, "after": {"sub_no_result": 0.3},
                                           "change": {"sub_no_result": {"diff": 0.1, "low": 0.02, "high": 0.18}}}}}
    lines = report._endings_section(summary)
    assert "| frozen-sub | sub-agents without a result (out of turns) | 20.0 | 30.0 | +10.0 [+2.0, +18.0] |" in lines


def test_a_curve_point_reads_the_subsets_episodes_only():
    """Questions 0-1 of an evaluation with 2 samples each (seeds 10-13); question 2 (seeds 14-15) is not
    in a 2-question curve."""
    eps = [_episode("q0", ["answer"], True, True, [], seed=10), _episode("q0", ["answer"], True, False, [], seed=11),
           _episode("q1", ["error", "tool_call"], False, False, [(["error"], False)], seed=12),
           _episode("q1", ["answer"], True, True, [], seed=13),
           _episode("q2", ["answer"], True, True, [], seed=14), _episode("q2", ["answer"], True, True, [], seed=15)]
    point = curve_point(list(reversed(eps)), questions=2, samples=2, max_delegations=3)
    assert point["episodes"] == 4 and point["em"] == pytest.approx(2 / 4)
    assert point["f1"] == pytest.approx(2 / 4)  # Paris twice, Rome (0) once, no answer (0) once
    assert point["turn_limit_episodes"] == pytest.approx(1 / 4) and point["sub_no_result"] == pytest.approx(1.0)
    assert point["answered_accuracy"] == pytest.approx(2 / 3)
    # the band: q0 and q1 are each right once in two, so every bootstrap resample of them means 1/2
    assert (point["em_low"], point["em_high"]) == (0.5, 0.5)
    # q0 twice right, q1 never: a resample holds q0 0, 1 or 2 times (means 0, 1/2, 1; chances 1/4, 1/2, 1/4)
    apart = [_episode("q0", ["answer"], True, True, [], seed=10), _episode("q0", ["answer"], True, True, [], seed=11),
             _episode("q1", ["answer"], True, False, [], seed=12), _episode("q1", ["answer"], True, False, [], seed=13)]
    spread = curve_point(apart, questions=2, samples=2, max_delegations=3)
    assert (spread["em"], spread["em_low"], spread["em_high"]) == (0.5, 0.0, 1.0)
    # an evaluation of exactly the subset gives its own EM and F1 (its report)
    reported = curve_point(eps[:4], questions=2, samples=2, max_delegations=3,
                           report=types.SimpleNamespace(exact_match=0.25, f1=0.3))
    assert (reported["em"], reported["f1"]) == (0.25, 0.3)
    assert curve_point([], questions=2, samples=2, max_delegations=3) == {}


def test_the_sweeps_hop_skill_counts_every_delegated_sub_agent():
    """benchmarks/credit_sweep.py: per question, each delegated sub-agent's expert score; no result = 0."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "credit_sweep.py"
    spec = importlib.util.spec_from_file_location("credit_sweep", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    a = _episode("q0", ["tool_call", "answer"], True, True, [(["tool_call", "result"], True), (["error"], False)])
    a.subs[0].expert, a.subs[1].expert = 1.0, 1.0  # a score on a sub-agent without a result still counts 0
    b = _episode("q1", ["answer"], True, False, [(["tool_call", "result"], True)])
    b.subs[0].expert = None
    assert module.hop_skill([a, b]) == {"q0": [1.0, 0.0], "q1": [0.0]}
