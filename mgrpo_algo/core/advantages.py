"""Group-relative advantages of M-GRPO (paper sections 3-4), as pure vectorised functions.

* :func:`main_advantages`: rewards ``[Q, K]`` (Q queries, K rollouts each) -> ``A_M = (R - mean_K) / std_K``.
* :func:`sub_advantages`: rewards ``[Q, K, d]`` after trajectory alignment -> pooled per query over all
  unmasked ``K * d`` slots. A slot duplicated by alignment holds its reward twice and so counts twice
  in the statistics: that is the paper's alignment, not a bug.

Both use the population std (``unbiased=False``), give exactly 0 where the std is below ``eps``
(every rollout scored the same: no signal, and no NaN), and give 0 to masked (absent) entries, which
are also left out of the statistics. Statistics are computed in float64; results are float32 tensors
on the input's device. Inputs may be tensors, numpy arrays or nested lists.

Estimators live in a registry like verl's: ``get_estimator("grpo")`` / ``get_estimator("grpo_pooled_masked")``.

>>> main_advantages([[1.0, 0.0, 0.0, 1.0]]).tolist()
[[1.0, -1.0, -1.0, 1.0]]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from mgrpo_tools.registry import Registry

__all__ = [
    "EPS",
    "ESTIMATORS",
    "Estimator",
    "register_estimator",
    "get_estimator",
    "main_advantages",
    "sub_advantages",
    "group_stats",
    "step_advantages",
]

#: Below this population std a group carries no signal and its advantages are exactly 0.
EPS = 1e-6

ArrayLike = Tensor | np.ndarray | Sequence[Any]
#: The one shape every estimator takes: ``estimator(rewards [Q, ...], mask [Q, ...] | None = None, *,
#: eps=EPS) -> float32 advantages`` of the rewards' shape, one group per query (everything after the
#: first axis). The main side passes [Q, K], the sub side its aligned [Q, K, d] slots and their mask.
Estimator = Callable[..., Tensor]

#: Advantage estimators by name (``TrainConfig.main_estimator`` / ``sub_estimator``, checked when the
#: config loads). A new estimator is one function registered here (examples/extend/new_estimator.py).
ESTIMATORS: Registry[Estimator] = Registry("advantage estimator")
register_estimator = ESTIMATORS.register
get_estimator = ESTIMATORS.get


def _as_float64(x: ArrayLike) -> Tensor:
    if isinstance(x, Tensor):
        return x.detach().to(torch.float64)
    return torch.as_tensor(np.asarray(x, dtype=np.float64))


def _as_mask(mask: ArrayLike | None, like: Tensor) -> Tensor:
    """Bool mask with ``like``'s shape and device; None means every entry is present."""
    if mask is None:
        return torch.ones_like(like, dtype=torch.bool)
    m = mask.detach() if isinstance(mask, Tensor) else torch.as_tensor(np.asarray(mask))
    if tuple(m.shape) != tuple(like.shape):
        raise ValueError(f"mask has shape {tuple(m.shape)} but rewards have shape {tuple(like.shape)}")
    return m.to(like.device) != 0


def _group_moments(r: Tensor, m: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-group count, mean and population std over every axis but the first.

    Shapes: r, m [Q, ...] -> each output [Q, 1, ..., 1] (broadcastable against r). Empty groups get
    count 0, mean 0, std 0.
    """
    dims = tuple(range(1, r.ndim))
    mf = m.to(r.dtype)
    n = mf.sum(dim=dims, keepdim=True)
    safe_n = n.clamp_min(1.0)  # an all-masked group: 0 / 1 instead of 0 / 0
    mean = (r * mf).sum(dim=dims, keepdim=True) / safe_n
    var = (((r - mean) * mf) ** 2).sum(dim=dims, keepdim=True) / safe_n
    return n, mean, var.sqrt()


def _standardize(rewards: ArrayLike, mask: ArrayLike | None, eps: float, min_ndim: int, what: str) -> Tensor:
    r = _as_float64(rewards)
    if r.ndim < min_ndim:
        raise ValueError(f"{what} expects rewards with at least {min_ndim} axes, got shape {tuple(r.shape)}")
    m = _as_mask(mask, r)
    # Masked entries may hold anything (NaN padding included): zero them before any arithmetic.
    r = torch.where(m, r, torch.zeros_like(r))
    _, mean, std = _group_moments(r, m)
    has_signal = std >= eps
    adv = (r - mean) / torch.where(has_signal, std, torch.ones_like(std))
    return torch.where(m & has_signal, adv, torch.zeros_like(adv)).to(torch.float32)


@register_estimator("grpo")
def main_advantages(rewards: ArrayLike, mask: ArrayLike | None = None, *, eps: float = EPS) -> Tensor:
    """GRPO advantages of the main agent, one group of K rollouts per query.

    Args:
        rewards: [Q, K] rewards R_M.
        mask: optional [Q, K] bool / 0-1; False marks an absent rollout (left out of the stats, gets 0).
        eps: a group whose population std is below this gets advantage 0 everywhere.

    Returns:
        float32 [Q, K]: ``(R - mean_K) / std_K`` per query (population std).
    """
    r = _as_float64(rewards)
    if r.ndim != 2:
        raise ValueError(f"main_advantages expects rewards [Q, K], got shape {tuple(r.shape)}")
    return _standardize(r, mask, eps, 2, "main_advantages")


@register_estimator("grpo_pooled_masked")
def sub_advantages(rewards: ArrayLike, mask: ArrayLike | None = None, *, eps: float = EPS) -> Tensor:
    """Sub-agent advantages pooled per query over all aligned slots (M-GRPO's trajectory alignment).

    Args:
        rewards: [Q, K, d] rewards R_S of the aligned slots (any [Q, ...] works: everything after the
            query axis is one pool). A duplicated slot appears, and counts, as many times as it was placed.
        mask: [Q, K, d] bool / 0-1; False marks a masked slot (weight 0). None means all present.
        eps: a query whose pooled population std is below this gets advantage 0 everywhere.

    Returns:
        float32 [Q, K, d]: ``(R - mean) / std`` over the query's unmasked slots; masked slots and
        all-masked queries get 0.
    """
    return _standardize(rewards, mask, eps, 2, "sub_advantages")


def step_advantages(anchors: Sequence[Any], returns: Sequence[float], *, eps: float = EPS) -> list[float]:
    """Step-level advantages over anchor states (GiGPO, Feng et al. 2025, arXiv 2505.10978).

    Turns of one group's rollouts that start from the *same* state (the same observation history,
    ``anchors[i]`` equal) form an anchor group; each turn's step advantage is its return standardised
    within that group: ``(G_i - mean) / std`` (population std). A turn whose state no other turn
    shares, or whose anchor group's returns all agree, gets 0: only states where the group's rollouts
    took different actions give credit, and that credit is the difference their outcomes made.

    Args:
        anchors: one hashable state key per turn (e.g. the prompt the turn was sampled from).
        returns: that turn's return G_i (here the episode's terminal reward: undiscounted, one
            reward at the end).
        eps: an anchor group whose std is below this gives 0.

    Returns:
        One float per turn, in order.

    >>> step_advantages(["s0", "s0", "s1", "s0"], [1.0, 0.0, 1.0, 1.0])
    [0.7071067811865476, -1.414213562373095, 0.0, 0.7071067811865476]
    """
    if len(anchors) != len(returns):
        raise ValueError(f"{len(anchors)} anchors for {len(returns)} returns")
    groups: dict[Any, list[int]] = {}
    for i, key in enumerate(anchors):
        groups.setdefault(key, []).append(i)
    out = [0.0] * len(anchors)
    for members in groups.values():
        if len(members) < 2:
            continue
        values = np.asarray([returns[i] for i in members], dtype=np.float64)
        std = float(values.std())
        if std < eps:
            continue
        mean = float(values.mean())
        for i in members:
            out[i] = (float(returns[i]) - mean) / std
    return out


def group_stats(rewards: ArrayLike, mask: ArrayLike | None = None, *, eps: float = EPS) -> dict[str, float]:
    """Reward statistics of a batch of groups, for logging (prefix them with the role yourself).

    Args:
        rewards: [Q, K] or [Q, K, d]; a group is everything after the first axis.
        mask: optional bool / 0-1 of the same shape; False entries are ignored.

    Returns:
        ``mean``: mean of all unmasked rewards; ``std``: mean within-group population std over groups
        with at least one entry; ``zero_std_frac``: fraction of groups that give no learning signal
        (std below ``eps``, all-masked groups included); ``num_groups``: Q.
    """
    r = _as_float64(rewards)
    if r.ndim < 2:
        raise ValueError(f"group_stats expects rewards [Q, ...], got shape {tuple(r.shape)}")
    m = _as_mask(mask, r)
    r = torch.where(m, r, torch.zeros_like(r))
    n, _, std = _group_moments(r, m)
    n, std = n.flatten(), std.flatten()
    total = float(n.sum())
    nonempty = n > 0
    num_groups = int(r.shape[0])
    return {
        "mean": float(r.sum()) / total if total else 0.0,
        "std": float(std[nonempty].mean()) if bool(nonempty.any()) else 0.0,
        "zero_std_frac": float((std < eps).double().mean()) if num_groups else 0.0,
        "num_groups": float(num_groups),
    }
