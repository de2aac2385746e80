"""``mgrpo compare --jobs``: which process runs which unit of work.

A unit is one (seed, mode) training run with its evaluations, or the reference start's evaluation.
Each unit is seeded on its own, so where it runs does not change a number; only the wall time depends
on the assignment. Units go longest first to the least loaded process (LPT, Graham 1969), by a fixed
estimate of each unit's cost: the demo's timings, nothing measured at run time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["REFERENCE", "COST", "Unit", "units", "assign"]

#: The unit that evaluates ``eval.reference`` (the oracle clone); not a mode name.
REFERENCE = "reference"

#: Estimated minutes per unit: configs/demo.yaml, one seed, 2 cores, measured on an idle machine
#: (mgrpo ~11, frozen-sub ~9, single-agent ~6.3, the reference evaluation ~1.5; a start evaluation,
#: ~1.5, is not counted: a process does it once per group and seed). Only their ratios steer the
#: assignment; a mode not listed is costed as mgrpo (the dearest).
COST: dict[str, float] = {"mgrpo": 11.0, "frozen-sub": 9.0, "single-agent": 6.5, REFERENCE: 1.5}


@dataclass(frozen=True)
class Unit:
    """One unit of work: ``mode`` (or :data:`REFERENCE`) at ``seed``, from the start models of ``group``
    (:func:`mgrpo_algo.experiments.compare._start_name`)."""

    mode: str
    seed: int
    group: str


def units(groups: Mapping[str, Sequence[str]], seeds: Sequence[int], reference_group: str | None) -> list[Unit]:
    """Every unit in the order one process runs them: group by group (as ``groups`` lists them), the
    reference first in ``reference_group``, then seed by seed, the group's modes inside a seed (so the
    modes of one seed follow each other and share their start evaluation)."""
    out: list[Unit] = []
    for group, modes in groups.items():
        if group == reference_group:
            out.append(Unit(REFERENCE, seeds[0], group))
        out += [Unit(mode, seed, group) for seed in seeds for mode in modes]
    return out


def assign(work: Sequence[Unit], jobs: int, cost: Mapping[str, float] = COST) -> list[list[Unit]]:
    """``work`` over ``min(jobs, len(work))`` processes, longest first to the least loaded (ties: the
    earlier unit, the lower process). Each process's units keep ``work``'s order (a group's start
    evaluation then serves its next units); process 0 gets the longest unit (it runs in the caller, with
    the progress bars). With one process: ``work`` as given."""
    jobs = max(1, min(jobs, len(work)))
    default = max(cost.values(), default=1.0)
    order = sorted(range(len(work)), key=lambda i: -cost.get(work[i].mode, default))  # stable: ties keep order
    loads = [0.0] * jobs
    picked: list[list[int]] = [[] for _ in range(jobs)]
    for i in order:
        process = loads.index(min(loads))
        loads[process] += cost.get(work[i].mode, default)
        picked[process].append(i)
    return [[work[i] for i in sorted(indices)] for indices in picked]
