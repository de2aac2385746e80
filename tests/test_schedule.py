"""``compare --jobs``'s schedule (mgrpo_algo.experiments.schedule): the units in one process's order and
their longest-first assignment, on hand-worked loads."""

from __future__ import annotations

from mgrpo_algo.experiments.schedule import COST, REFERENCE, Unit, assign, units

GROUPS = {"hierarchy": ["mgrpo", "frozen-sub"], "single": ["single-agent"]}


def test_units_go_group_by_group_the_reference_first_in_its_group_seeds_inside():
    assert units(GROUPS, [0, 1], "single") == [
        Unit("mgrpo", 0, "hierarchy"), Unit("frozen-sub", 0, "hierarchy"),
        Unit("mgrpo", 1, "hierarchy"), Unit("frozen-sub", 1, "hierarchy"),
        Unit(REFERENCE, 0, "single"), Unit("single-agent", 0, "single"), Unit("single-agent", 1, "single")]
    assert REFERENCE not in {u.mode for u in units(GROUPS, [3], None)}


def test_one_process_runs_every_unit_in_order():
    work = units(GROUPS, [0, 1], "single")
    assert assign(work, 1) == [work]
    assert assign(work, 0) == [work]  # no fewer than one process


def test_the_demo_on_two_processes():
    """mgrpo 11 -> P0 (11); frozen-sub 9 -> P1 (9); single-agent 6.5 -> P1, the less loaded (15.5);
    the reference 1.5 -> P0 (12.5). Each process keeps the one-process order."""
    mgrpo, frozen, ref, single = units(GROUPS, [0], "single")
    assert assign([mgrpo, frozen, ref, single], 2) == [[mgrpo, ref], [frozen, single]]
    assert (COST["mgrpo"] + COST[REFERENCE], COST["frozen-sub"] + COST["single-agent"]) == (12.5, 15.5)


def test_two_seeds_on_two_processes_keep_each_seeds_hierarchy_together():
    """Costs 11, 9, 11, 9, 1.5, 6.5, 6.5 (one-process order). Longest first, ties in order and to the
    lower process: m0 -> P0 11, m1 -> P1 11, f0 -> P0 20, f1 -> P1 20, s0 -> P0 26.5, s1 -> P1 26.5,
    ref -> P0 28: each process evaluates one hierarchy start (its seed's) and one single-agent start."""
    m0, f0, m1, f1, ref, s0, s1 = units(GROUPS, [0, 1], "single")
    assert assign([m0, f0, m1, f1, ref, s0, s1], 2) == [[m0, f0, ref, s0], [m1, f1, s1]]


def test_more_processes_than_units_and_costs_given():
    m, f, s = units(GROUPS, [5], None)
    assert assign([m, f, s], 8) == [[m], [f], [s]]  # never an idle process
    # given costs (and a mode they do not list: costed as the dearest listed, 4)
    odd = Unit("new-mode", 5, "x")
    # new-mode 4 -> P0; mgrpo 3 -> P1; frozen-sub 2 -> P1 (3 < 4) = 5; single-agent 1 -> P0 = 5
    assert assign([m, f, s, odd], 2, {"mgrpo": 3, "frozen-sub": 2, "single-agent": 1, "other": 4}) == [
        [s, odd], [m, f]]
