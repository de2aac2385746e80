"""Both sides of an iteration scored in one process, from the rewards the env paid: the reference the
tests hold the split scoring against (the loop scores the main side, the sub worker its own side from
the store's statistics; together they must give what this gives)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from mgrpo_algo.core.scoring import (
    CalledSlot,
    MainSlot,
    alignment_metrics,
    score_main_side,
    score_sub_side,
    sub_facts,
    turn_states,
)
from mgrpo_env.episode import EpisodeRecord


@dataclass
class ScoredBatch:
    """Both sides of one iteration: typed slots and the scoring metrics."""

    main: list[MainSlot]
    sub: list[CalledSlot]
    d: int
    metrics: dict[str, float] = field(default_factory=dict)


def score_batch(
    records: Sequence[EpisodeRecord], k: int, d: int, *, strategy: str, rng: np.random.Generator, single: bool = False,
    step_weight: float = 0.0,
) -> ScoredBatch:
    """Records of B x K rollouts (task-major) -> both sides scored here, from the rewards the env paid
    (:func:`score_main_side` and :func:`score_sub_side`; the training loop runs the sub side on the
    sub worker instead, from the store's statistics). ``single``: no sub side."""
    main, metrics = score_main_side(records, k, role="single" if single else "main", step_weight=step_weight)
    if single:
        return ScoredBatch(main, [], 0, metrics)
    states = {(i, j): turn_states(t) for i, r in enumerate(records) for j, t in enumerate(r.subs)}
    sub, sub_metrics = score_sub_side(sub_facts(records), [[s.reward for s in r.subs] for r in records], k, d,
                                      strategy=strategy, rng=rng, step_weight=step_weight, states=states)
    metrics.update(sub_metrics)
    metrics.update(alignment_metrics(records, d))
    return ScoredBatch(main, sub, d, metrics)
