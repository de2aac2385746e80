"""Trajectory alignment: shapes, index ranges, uniformity of drops and duplicates, choose_d."""

import doctest
from collections import Counter

import numpy as np
import pytest

from mgrpo_env import align
from mgrpo_env.align import (
    STRATEGIES,
    AlignmentStats,
    choose_d,
    plan,
    plan_with_stats,
    register_strategy,
)

COUNTS = [0, 1, 2, 3, 4, 5, 7, 11]


def rng(seed=0):
    return np.random.default_rng(seed)


def test_doctests():
    assert doctest.testmod(align).failed == 0


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
@pytest.mark.parametrize("d", [1, 3, 4, 8])
def test_shapes_and_ranges(strategy, d):
    p = plan(COUNTS, d, strategy=strategy, rng=rng())
    assert len(p) == len(COUNTS)
    for d_k, row in zip(COUNTS, p, strict=True):
        assert len(row) == d
        assert all(s is None or (isinstance(s, int) and 0 <= s < d_k) for s in row)
        used = [s for s in row if s is not None]
        if d_k == 0:
            assert row == [None] * d
        elif d_k <= d:
            assert set(used) == set(range(d_k))  # every original kept
            assert row[:d_k] == list(range(d_k))  # originals first, in order
        else:
            assert len(set(used)) == d == len(used)  # a subset, no repeats
            assert used == sorted(used)
        if strategy == "mask":
            assert len(used) == min(d_k, d)
        elif d_k > 0:
            assert None not in row
    assert len(p) == len(COUNTS) and {len(row) for row in p} == {d}


def test_exact_plans_of_deterministic_cases():
    assert plan([0], 3, rng=rng()) == [[None, None, None]]
    assert plan([3], 3, rng=rng()) == [[0, 1, 2]]
    assert plan([2], 2, strategy="mask", rng=rng()) == [[0, 1]]
    assert plan([2], 4, strategy="mask", rng=rng()) == [[0, 1, None, None]]
    assert plan([2], 6, strategy="duplicate_balanced", rng=rng()) == [[0, 1, 0, 1, 0, 1]]
    assert plan([1], 4, rng=rng()) == [[0, 0, 0, 0]]
    assert plan([], 4, rng=rng()) == []


def test_stats():
    p, stats = plan_with_stats([0, 2, 3, 5], 3, rng=rng())
    assert stats == AlignmentStats(
        num_rollouts=4, num_zero=1, num_duplicated_slots=1, num_dropped=2, num_masked_slots=3
    )
    assert sum(s is not None for row in p for s in row) == 4 * 3 - 3
    _, stats = plan_with_stats([0, 2, 3, 5], 3, strategy="mask", rng=rng())
    assert (stats.num_duplicated_slots, stats.num_dropped, stats.num_masked_slots) == (0, 2, 4)
    assert stats.to_metrics()["align/num_masked_slots"] == 4.0
    _, stats = plan_with_stats([1, 2], 7, strategy="duplicate_balanced", rng=rng())
    assert stats.num_duplicated_slots == 6 + 5


def test_determinism_under_seed():
    counts = [0, 1, 3, 9, 12, 2, 5]
    for strategy in STRATEGIES:
        assert plan(counts, 5, strategy=strategy, rng=rng(7)) == plan(
            counts, 5, strategy=strategy, rng=rng(7)
        )
    assert plan(counts, 5, rng=rng(1)) != plan(counts, 5, rng=rng(2))


N = 20_000


def _within_3_sigma(counter: Counter, keys, n_draws: int, p: float):
    expected = n_draws * p
    sigma = np.sqrt(n_draws * p * (1 - p))
    for k in keys:
        assert abs(counter[k] - expected) < 3 * sigma, (k, counter[k], expected)


@pytest.mark.parametrize("strategy", ["duplicate", "duplicate_balanced", "mask"])
def test_dropped_one_is_uniform(strategy):
    # d_k = 5, d = 4: exactly one original is dropped, each with probability 1/5.
    rows = plan([5] * N, 4, strategy=strategy, rng=rng(123))
    dropped = Counter(next(i for i in range(5) if i not in row) for row in rows)
    _within_3_sigma(dropped, range(5), N, 1 / 5)


def test_subset_is_uniform_over_subsets():
    # d_k = 5, d = 2: each of the 10 pairs equally likely.
    rows = plan([5] * N, 2, rng=rng(5))
    pairs = Counter(tuple(row) for row in rows)
    assert len(pairs) == 10
    _within_3_sigma(pairs, pairs.keys(), N, 1 / 10)


def test_duplicates_uniform_with_replacement():
    # d_k = 3, d = 5: two extra slots, each drawn uniformly from {0, 1, 2}, independently.
    rows = plan([3] * N, 5, rng=rng(11))
    extras = Counter(s for row in rows for s in row[3:])
    _within_3_sigma(extras, range(3), 2 * N, 1 / 3)
    same = sum(row[3] == row[4] for row in rows)  # with replacement: P(same) = 1/3
    _within_3_sigma(Counter(same=same), ["same"], N, 1 / 3)


def test_duplicates_balanced_without_replacement():
    # d_k = 3, d = 5: 0,1,2 then two distinct extras, each original duplicated w.p. 2/3.
    rows = plan([3] * N, 5, strategy="duplicate_balanced", rng=rng(11))
    assert all(row[3] != row[4] for row in rows)
    extras = Counter(s for row in rows for s in row[3:])
    _within_3_sigma(extras, range(3), N, 2 / 3)
    for row in rows[:100]:
        copies = Counter(row).values()
        assert max(copies) - min(copies) <= 1


def test_choose_d():
    assert choose_d([0, 1, 1, 2, 8], 0.8) == 2
    assert choose_d([0, 1, 1, 2, 8], 0.99) == 8
    assert choose_d([0, 1, 1, 2, 8], 0.6) == 1
    assert choose_d([0, 0, 0], 0.99) == 1  # d >= 1 even when nobody delegates
    assert choose_d([3, 3, 3], 1.0) == 3
    assert choose_d(list(range(1, 101)), 0.99) == 99
    assert choose_d(np.array([4, 2]), 0.5) == 2


@pytest.mark.parametrize(
    ("counts", "q"), [([], 0.9), ([1, -1], 0.9), ([1.5], 0.9), ([1], 0.0), ([1], 1.5), ([True], 0.9)]
)
def test_choose_d_bad_inputs(counts, q):
    with pytest.raises(ValueError):
        choose_d(counts, q)


@pytest.mark.parametrize(
    ("counts", "d", "strategy", "match"),
    [
        ([1], 0, "duplicate", "d must be"),
        ([1], 2.0, "duplicate", "d must be"),
        ([1], True, "duplicate", "d must be"),
        ([-1], 2, "duplicate", "counts"),
        ([1.0], 2, "duplicate", "counts"),
        ([1], 2, "nope", "duplicate_balanced.*mask"),
    ],
)
def test_plan_bad_inputs(counts, d, strategy, match):
    with pytest.raises(ValueError, match=match):
        plan(counts, d, strategy=strategy, rng=rng())


def test_plan_needs_a_generator():
    with pytest.raises(TypeError):
        plan([1], 2, rng=np.random.RandomState(0))  # type: ignore[arg-type]


def test_registry_refuses_duplicates():
    with pytest.raises(ValueError, match="already registered"):
        register_strategy("mask", lambda d_k, d, r: [None] * d)


# --- found by mutation testing (benchmarks/mutation.py) ---


def test_register_strategy_stores_the_function():
    def first(d_k, d, r):
        return [0] * d

    try:
        assert register_strategy("test-first", first) is first
        assert STRATEGIES["test-first"] is first
        assert plan([2, 1], 3, strategy="test-first", rng=rng()) == [[0, 0, 0], [0, 0, 0]]
    finally:
        STRATEGIES.unregister("test-first")


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_exact_counts_draw_no_randomness(strategy):
    # d_k == d everywhere: the plan is fixed, and the generator is left as it was
    g = rng(3)
    assert plan([2, 2, 2], 2, strategy=strategy, rng=g) == [[0, 1]] * 3
    assert g.random() == rng(3).random()


def test_dropped_summed_over_rollouts():
    _, stats = plan_with_stats([3, 4, 2], 2, rng=rng())
    assert stats.num_dropped == 1 + 2 + 0


def test_choose_d_default_quantile_and_single_count():
    assert choose_d(list(range(100))) == 98  # P(d_k <= 98) = .99
    assert choose_d([3]) == 3
    assert choose_d([0]) == 1


def test_error_messages():
    with pytest.raises(TypeError, match=r"^rng must be a numpy.random.Generator, got RandomState$"):
        plan([1], 2, rng=np.random.RandomState(0))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^quantile must be in \(0, 1\], got 0.0$"):
        choose_d([1], 0.0)
    with pytest.raises(ValueError, match=r"^choose_d needs at least one observed count$"):
        choose_d([])
    with pytest.raises(ValueError, match=r"^observed counts must be integers >= 0$"):
        choose_d([1, -1])
