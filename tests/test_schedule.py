"""``compare``'s units of work (mgrpo_algo.experiments.schedule): one process's order, and the longest-first
order a ``--jobs`` pool takes them in, with the wall time that order gives worked by hand."""

from __future__ import annotations

from mgrpo_algo.experiments.schedule import COST, REFERENCE, START, Unit, longest_first, units

GROUPS = {"hierarchy": ["mgrpo", "frozen-sub"], "single": ["single-agent"]}


def test_units_go_group_by_group_the_reference_first_then_each_seeds_start_before_its_runs():
    assert units(GROUPS, [0, 1], "single") == [
        Unit(START, 0, "hierarchy", greedy=True), Unit("mgrpo", 0, "hierarchy"), Unit("frozen-sub", 0, "hierarchy"),
        Unit(START, 1, "hierarchy"), Unit("mgrpo", 1, "hierarchy"), Unit("frozen-sub", 1, "hierarchy"),
        Unit(REFERENCE, 0, "single"), Unit(START, 0, "single", greedy=True), Unit("single-agent", 0, "single"),
        Unit(START, 1, "single"), Unit("single-agent", 1, "single")]
    assert REFERENCE not in {u.mode for u in units(GROUPS, [3], None)}


def test_a_greedy_evaluation_evaluates_each_start_once():
    """At temperature 0 every seed's start evaluation gives the same episodes: one per group, its first seed's."""
    assert [u for u in units(GROUPS, [3, 4], None, start_per_seed=False) if u.mode == START] == [
        Unit(START, 3, "hierarchy", greedy=True), Unit(START, 3, "single", greedy=True)]


def _makespan(order: list[Unit], jobs: int) -> float:
    """The wall time of a pool of ``jobs`` processes that each take the next unit of ``order`` as they free up."""
    free = [0.0] * jobs
    for unit in order:
        first = free.index(min(free))
        free[first] += COST[unit.mode]
    return max(free)


def test_the_demo_longest_first_fills_the_end_with_the_short_evaluations():
    """mgrpo 10 -> P0; frozen-sub 8 -> P1; P1 frees at 8: single-agent 5.5 (13.5); P0 at 10: the hierarchy's
    start 1.8 (11.8), the single agent's start 1.8 (13.6); P1 at 13.5: the reference 1.5 (15.0). 15.0, near
    the 28.6 units of work over two cores (14.3), against 16.8 in the one-process order
    (start 1.8 | mgrpo 10; frozen-sub -> P0 9.8, reference 11.3, single start -> P1 11.8, single-agent -> P0 16.8)."""
    work = units(GROUPS, [0], "single")
    start_h, mgrpo, frozen, ref, start_s, single = work
    queue = longest_first(work)
    assert queue == [mgrpo, frozen, single, start_h, start_s, ref]
    assert _makespan(queue, 2) == 15.0
    assert round(_makespan(work, 2), 1) == 16.8 and round(sum(COST[u.mode] for u in work), 1) == 28.6


def test_ties_keep_the_given_order_and_a_mode_not_costed_counts_as_the_dearest():
    m, f, s = Unit("mgrpo", 5, "h"), Unit("frozen-sub", 5, "h"), Unit("single-agent", 5, "s")
    odd, m6 = Unit("new-mode", 5, "x"), Unit("mgrpo", 6, "h")
    assert longest_first([s, m6, f, m]) == [m6, m, f, s]  # the two mgrpo runs as given
    assert longest_first([s, f, odd], {"mgrpo": 3, "frozen-sub": 2, "single-agent": 1}) == [odd, f, s]
    assert longest_first([]) == []
