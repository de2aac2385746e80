"""mean@k, pass@k and the paired bootstrap, checked against values computed by hand."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from mgrpo_algo.experiments.intervals import (
    mean_at_k,
    paired_difference,
    pass_at_k,
    per_question,
    pool_runs,
    question_means,
)


def _rec(task_id: str, correct: bool) -> SimpleNamespace:
    return SimpleNamespace(task={"id": task_id}, correct=correct)


def test_per_question_keeps_samples_in_order() -> None:
    records = [_rec("a", True), _rec("a", False), _rec("b", False), _rec("a", True), _rec("b", True)]
    assert per_question(records) == {"a": [True, False, True], "b": [False, True]}


def test_mean_at_k_averages_questions_not_episodes() -> None:
    # a: 1/4 correct, b: 4/4 -> mean@4 = (0.25 + 1.0) / 2 = 0.625 (the episode mean would be the same
    # only with equal sample counts; with 4 and 2 samples it differs)
    assert mean_at_k({"a": [1, 0, 0, 0], "b": [1, 1, 1, 1]}) == pytest.approx(0.625)
    assert mean_at_k({"a": [1, 0, 0, 0], "b": [1, 1]}) == pytest.approx((0.25 + 1.0) / 2)
    with pytest.raises(ValueError):
        mean_at_k({})


def test_pass_at_k_unbiased_estimator_by_hand() -> None:
    # n=4, c=1: pass@1 = 1/4; pass@2 = 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5; pass@4 = 1
    scores = {"a": [True, False, False, False]}
    assert pass_at_k(scores, 1) == pytest.approx(0.25)
    assert pass_at_k(scores, 2) == pytest.approx(0.5)
    assert pass_at_k(scores) == pytest.approx(1.0)
    # two questions: a as above, b never correct -> pass@2 = (0.5 + 0) / 2
    assert pass_at_k({**scores, "b": [False] * 4}, 2) == pytest.approx(0.25)
    with pytest.raises(ValueError, match="at least 5 samples"):
        pass_at_k(scores, 5)


def test_pool_runs_concatenates_per_question() -> None:
    pooled = pool_runs([{"a": [True], "b": [False]}, {"a": [False], "b": [False]}])
    assert pooled == {"a": [True, False], "b": [False, False]}
    with pytest.raises(ValueError):
        pool_runs([{"a": [True]}, {"b": [True]}])


def test_paired_difference_mean_and_interval() -> None:
    rng = np.random.default_rng(0)
    start = {f"q{i}": list(rng.random(4) < 0.3) for i in range(300)}
    # after: each sample of a question flips to correct with probability 0.25 (a noisy gain)
    after = {q: [bool(c or rng.random() < 0.25) for c in v] for q, v in start.items()}
    diffs = np.array([np.mean(after[q]) - np.mean(start[q]) for q in start])
    res = paired_difference(after, start, resamples=4000, seed=1)
    assert res["diff"] == pytest.approx(float(diffs.mean()))
    assert res["questions"] == 300
    assert res["low"] < res["diff"] < res["high"]
    assert res["low"] > 0  # no question lost a correct sample: the interval is above 0
    # the interval's half-width is near 1.96 standard errors of the per-question differences
    se = diffs.std(ddof=1) / math.sqrt(len(diffs))
    assert (res["high"] - res["low"]) / 2 == pytest.approx(1.96 * se, rel=0.15)
    # swapping the two negates the difference and the interval
    rev = paired_difference(start, after, resamples=4000, seed=1)
    assert rev["diff"] == pytest.approx(-res["diff"])
    assert rev["high"] == pytest.approx(-res["low"], abs=0.005)


def test_paired_difference_no_spread_and_mismatch() -> None:
    same = {"a": [True, False], "b": [False, False]}
    res = paired_difference(same, same)
    assert res["diff"] == res["low"] == res["high"] == 0.0
    with pytest.raises(ValueError, match="same questions"):
        paired_difference(same, {"a": [True, False]})


def test_question_means() -> None:
    assert question_means({"a": [True, False, False, True]}) == {"a": 0.5}


def test_moving_average_by_hand() -> None:
    from mgrpo_algo.experiments.plots import moving_average

    assert moving_average([1.0, 2.0, 3.0, 4.0], 2) == [1.0, 1.5, 2.5, 3.5]
    assert moving_average([1.0, 2.0, 6.0], 5) == [1.0, 1.5, 3.0]
    with pytest.raises(ValueError):
        moving_average([1.0], 0)
