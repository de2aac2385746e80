"""Trajectory alignment (docs/design.md, "The method": trajectory alignment): fixed shapes for the sub-agent batch.

Rollout k of a query has d_k sub-trajectories (one per delegation; d_k varies and may be 0). The
sub learner wants exactly ``d`` per rollout, ``d * K`` per query. :func:`plan` decides, for each
rollout, which of its own sub-trajectories fill its ``d`` slots; ``None`` is a masked slot
(weight 0). Plans hold indices only, so they work for any record type.

Strategies (registry :data:`STRATEGIES`, add more with :func:`register_strategy`):

``"duplicate"`` (the paper's):
    d_k == d: slots ``[0, 1, ..., d-1]``.
    d_k < d: every original once, in order, then the d - d_k extra slots drawn uniformly **with
    replacement** from the rollout's own d_k (the plainest reading of "duplicate d - d_k of its
    sub-trajectories chosen uniformly at random"; an original may be duplicated more than once).
    d_k > d: a uniformly random subset of size d (without replacement), kept in delegation order.
    d_k == 0: all slots None (the paper leaves this case undefined; we mask and count it).
``"duplicate_balanced"``:
    like "duplicate", but the extra slots repeat every original floor(d / d_k) - 1 more times and
    draw the remaining d mod d_k **without** replacement, so that within a rollout the copy counts
    differ by at most one (lower variance of each sub-trajectory's weight; same expectation).
``"mask"``:
    originals (a random subset of size d when d_k > d), in order, then None up to d.

Slot order: originals come first in delegation order, extras after. The advantage is pooled
over all slots of a query and the loss averages over samples, so slot order never changes the
gradient; a fixed order keeps plans easy to read and the randomness limited to what is chosen.

Example:

>>> import numpy as np
>>> plan([0, 2, 3, 5], 3, rng=np.random.default_rng(0))
[[None, None, None], [0, 1, 1], [0, 1, 2], [1, 2, 4]]
>>> plan([0, 2, 3, 5], 3, strategy="mask", rng=np.random.default_rng(0))
[[None, None, None], [0, 1, None], [0, 1, 2], [2, 3, 4]]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from mgrpo_tools.registry import Registry

__all__ = [
    "Slot",
    "Plan",
    "STRATEGIES",
    "register_strategy",
    "plan",
    "plan_with_stats",
    "AlignmentStats",
    "choose_d",
    "OUTCOME_GROUPS",
]

#: How a query's aligned sub-agent slots are grouped for their outcome advantage A_S: "query" (the paper:
#: one pool of d x K slots) or "subtask" (one group per delegated subtask, so like is compared with like).
OUTCOME_GROUPS: tuple[str, ...] = ("query", "subtask")

Slot = int | None
Plan = list[list[Slot]]
#: A strategy maps (d_k, d, rng) to the d slots of one rollout, for d_k >= 1 (d_k == 0 is handled once, in plan).
Strategy = Callable[[int, int, np.random.Generator], list[Slot]]

#: Alignment strategies by name (``TrainConfig.align_strategy``, checked when the config loads).
STRATEGIES: Registry[Strategy] = Registry("alignment strategy")


def register_strategy(name: str, fn: Strategy) -> Strategy:
    """Add a strategy under ``name``; a duplicate name raises ValueError."""
    return STRATEGIES.add(name, fn)


def _subset(d_k: int, d: int, rng: np.random.Generator) -> list[Slot]:
    # Uniform subset of size d without replacement, back in delegation order.
    return sorted(int(i) for i in rng.choice(d_k, size=d, replace=False))


def _duplicate(d_k: int, d: int, rng: np.random.Generator) -> list[Slot]:
    if d_k >= d:
        return list(range(d)) if d_k == d else _subset(d_k, d, rng)
    return list(range(d_k)) + [int(i) for i in rng.integers(0, d_k, size=d - d_k)]


def _duplicate_balanced(d_k: int, d: int, rng: np.random.Generator) -> list[Slot]:
    if d_k >= d:
        return list(range(d)) if d_k == d else _subset(d_k, d, rng)
    rounds, remainder = divmod(d, d_k)
    return list(range(d_k)) * rounds + _subset(d_k, remainder, rng)


def _mask(d_k: int, d: int, rng: np.random.Generator) -> list[Slot]:
    if d_k > d:
        return _subset(d_k, d, rng)
    return list(range(d_k)) + [None] * (d - d_k)


register_strategy("duplicate", _duplicate)
register_strategy("duplicate_balanced", _duplicate_balanced)
register_strategy("mask", _mask)


@dataclass(frozen=True)
class AlignmentStats:
    """What alignment did to one query's (or one batch's) rollouts; log these under ``align/``.

    Attributes:
        num_rollouts: K, the number of rollouts planned.
        num_zero: rollouts with d_k == 0 (all their slots masked).
        num_duplicated_slots: slots filled by a copy of a sub-trajectory already in a slot.
        num_dropped: sub-trajectories left out (d_k > d).
        num_masked_slots: slots that are None (no sample goes to the learner).
    """

    num_rollouts: int
    num_zero: int
    num_duplicated_slots: int
    num_dropped: int
    num_masked_slots: int

    def to_metrics(self, prefix: str = "align/") -> dict[str, float]:
        """Flat ``{prefix + field: value}`` for a logger."""
        return {f"{prefix}{k}": float(v) for k, v in asdict(self).items()}


def _validate(num_subs: Sequence[int], d: int, strategy: str) -> list[int]:
    if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 1:
        raise ValueError(f"d must be an integer >= 1, got {d!r}")
    STRATEGIES.canonical(strategy)  # an unknown name raises, listing the valid ones
    counts = []
    for c in num_subs:
        if isinstance(c, bool) or not isinstance(c, (int, np.integer)) or c < 0:
            raise ValueError(f"sub-trajectory counts must be integers >= 0, got {c!r}")
        counts.append(int(c))
    return counts


def plan(num_subs: Sequence[int], d: int, *, strategy: str = "duplicate", rng: np.random.Generator) -> Plan:
    """Choose, for each rollout, the d sub-trajectories that fill its slots.

    Args:
        num_subs: d_k for each of the K rollouts, shape [K].
        d: slots per rollout (>= 1).
        strategy: a name in :data:`STRATEGIES` ("duplicate", "duplicate_balanced", "mask").
        rng: the only source of randomness (same seed, same plan).

    Returns:
        K lists of exactly d slots; slot j of rollout k is an index in ``range(num_subs[k])`` or None.

    Raises:
        ValueError: d < 1, a negative or non-integer count, or an unknown strategy.
    """
    return plan_with_stats(num_subs, d, strategy=strategy, rng=rng)[0]


def plan_with_stats(
    num_subs: Sequence[int], d: int, *, strategy: str = "duplicate", rng: np.random.Generator
) -> tuple[Plan, AlignmentStats]:
    """:func:`plan`, plus the :class:`AlignmentStats` of what it did."""
    counts = _validate(num_subs, d, strategy)
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    fn = STRATEGIES[strategy]
    out: Plan = []
    duplicated = dropped = masked = 0
    for d_k in counts:
        slots: list[Slot] = [None] * d if d_k == 0 else fn(d_k, d, rng)
        used = [s for s in slots if s is not None]
        duplicated += len(used) - len(set(used))
        dropped += d_k - len(set(used))
        masked += d - len(used)
        out.append(slots)
    stats = AlignmentStats(
        num_rollouts=len(counts),
        num_zero=sum(c == 0 for c in counts),
        num_duplicated_slots=duplicated,
        num_dropped=dropped,
        num_masked_slots=masked,
    )
    return out, stats


def choose_d(observed_counts: Sequence[int], quantile: float = 0.99) -> int:
    """The smallest d >= 1 with empirical P(d_k <= d) >= quantile.

    >>> choose_d([0, 1, 1, 2, 8], 0.8), choose_d([0, 1, 1, 2, 8], 0.99)
    (2, 8)
    """
    if not 0.0 < quantile <= 1.0:
        raise ValueError(f"quantile must be in (0, 1], got {quantile!r}")
    counts = np.asarray(list(observed_counts))
    if counts.size == 0:
        raise ValueError("choose_d needs at least one observed count")
    if not np.issubdtype(counts.dtype, np.integer) or counts.min() < 0:
        raise ValueError("observed counts must be integers >= 0")
    counts = np.sort(counts)
    # P(d_k <= v) at each observed value v; k / n is compared as a float, as a user would write q.
    frac = np.arange(1, counts.size + 1) / counts.size
    first = int(np.argmax(frac >= quantile))  # quantile <= 1 == frac[-1], so argmax always hits
    return max(1, int(counts[first]))
