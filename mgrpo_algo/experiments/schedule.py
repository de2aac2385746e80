"""``mgrpo compare``'s units of work and the order ``--jobs`` hands them out.

A unit is one start evaluation (a group of modes sharing their start models, under one seed), the
reference start's evaluation, or one (seed, mode) training run with its curve points and its evaluation
after training (:mod:`.units`). No unit waits for another: the caller joins each run with its start
once all are done. Each unit is seeded on its own, so where and when it runs changes no number; only
the wall time depends on the order.

With one process the units run in :func:`units`' order. With ``--jobs N`` they go to N processes
longest first, each process taking the next unit as it frees up (list scheduling in LPT order, Graham
1969), by a fixed estimate of each unit's cost: the demo's timings, nothing measured at run time.
The short start evaluations then fill the end, where a static split left one core idle for minutes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["REFERENCE", "START", "COST", "Unit", "units", "longest_first"]

#: The unit that evaluates ``eval.reference`` (the oracle clone); not a mode name.
REFERENCE = "reference"
#: The unit that evaluates a group's start models under one seed; not a mode name.
START = "start"

#: Estimated minutes per unit: configs/demo.yaml, one seed, one core each of an idle 2-core machine
#: (a run: training, its 3 curve points and its evaluation after; a start: the sampled evaluation and
#: the greedy pass). Only their order matters; a mode not listed is costed as the dearest listed.
COST: dict[str, float] = {"mgrpo": 10.0, "frozen-sub": 8.0, "single-agent": 5.5, START: 1.8, REFERENCE: 1.5}


@dataclass(frozen=True)
class Unit:
    """One unit of work: ``mode`` (or :data:`START`, :data:`REFERENCE`) at ``seed``, from the start models
    of ``group`` (:func:`mgrpo_algo.experiments.compare._start_name`). ``greedy``: a start unit that also
    makes the group's greedy pass (its first seed's)."""

    mode: str
    seed: int
    group: str
    greedy: bool = False


def units(groups: Mapping[str, Sequence[str]], seeds: Sequence[int], reference_group: str | None, *,
          start_per_seed: bool = True) -> list[Unit]:
    """Every unit in one process's order: group by group (as ``groups`` lists them), the reference first
    in ``reference_group``, then seed by seed: the group's start evaluation under that seed, then the
    group's modes. ``start_per_seed`` False (a greedy evaluation: the same episodes for every seed): one
    start evaluation per group, under the first seed."""
    out: list[Unit] = []
    for group, modes in groups.items():
        if group == reference_group:
            out.append(Unit(REFERENCE, seeds[0], group))
        for i, seed in enumerate(seeds):
            if start_per_seed or i == 0:
                out.append(Unit(START, seed, group, greedy=i == 0))
            out += [Unit(mode, seed, group) for mode in modes]
    return out


def longest_first(work: Sequence[Unit], cost: Mapping[str, float] = COST) -> list[Unit]:
    """``work`` by estimated cost, dearest first (ties keep ``work``'s order): the order a pool of
    processes takes them in, each the next as it frees up."""
    dearest = max(cost.values(), default=1.0)
    return sorted(work, key=lambda unit: -cost.get(unit.mode, dearest))
