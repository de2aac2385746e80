"""Batch scoring: B x K finished rollouts -> the main batch and the aligned sub batch, with advantages.

The one place where rewards become advantages, for every trainer and every placement::

    R_M [B, K]            -> A_M per query over its K rollouts       (score_main)
    R_S per sub-agent     -> d slots per rollout (alignment)          (score_sub)
                          -> A_S pooled per query over its d*K slots

Rewards are not computed here: the env pays R_M and R_S (with their components) at episode end, once.
Scoring only reads them. A rollout is addressed by its :class:`RolloutKey` (query q, rollout j,
position ``index`` in the task-major record list); nothing downstream does ``q*k+j`` arithmetic.

Pure: records in, typed slots and metrics out. The role worker that sampled a trajectory builds its
training sequence from the slot and the token ids it kept.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mgrpo_env import align
from mgrpo_env.episode import EpisodeRecord

from .advantages import get_estimator, group_stats, step_advantages

__all__ = [
    "COUNT_WINDOW",
    "RolloutKey",
    "MainSlot",
    "SubSlot",
    "alignment_width",
    "annotate_main",
    "annotate_sub",
    "turn_states",
    "anchor_state",
    "rollout_keys",
    "score_main",
    "score_sub",
    "score_main_side",
    "score_sub_side",
    "sub_facts",
    "SubFact",
    "SubScoring",
    "alignment_metrics",
]

#: Sub-agent counts kept to choose d (``align_d: 0``): the last this many rollouts.
COUNT_WINDOW = 10_000


@dataclass(frozen=True)
class RolloutKey:
    """Where a rollout is: query ``query``, rollout ``rollout`` of its group, ``index`` in the batch."""

    index: int
    query: int
    rollout: int


@dataclass(frozen=True)
class MainSlot:
    """One main (or single-agent) training sample: a rollout's main trajectory and its A_M."""

    key: RolloutKey
    agent: str
    reward: float
    advantage: float
    correct: float
    format_ok: bool
    turn_advantages: tuple[float, ...] | None = None
    """Per turn: ``advantage`` + w x the turn's step advantage (``step_weight`` > 0), else None."""


@dataclass(frozen=True)
class SubSlot:
    """One aligned sub-agent slot: ``slot`` of rollout ``key`` holds sub-agent ``agent`` (its
    ``sub``-th delegation). A duplicated sub-agent fills several slots, each a sample."""

    key: RolloutKey
    slot: int
    sub: int
    agent: str
    reward: float
    advantage: float
    turn_advantages: tuple[float, ...] | None = None
    """Per turn: ``advantage`` + w x the sub-agent's step advantage (``step_weight`` > 0), else None."""


@dataclass(frozen=True)
class SubFact:
    """What the sub side knows of one of its trajectories before the main statistics arrive: the
    agent, its format flag and expert score (None: no judge, b3 = 0) and where that score came from.
    A few bytes, no tokens: the loop sends these, the sub worker's own trajectories hold the rest."""

    agent: str
    format_ok: bool
    expert: float | None
    expert_source: str | None = None


@dataclass(frozen=True)
class SubScoring:
    """How the sub side scores an iteration (:func:`score_sub_side` and the paid R_S): the group size
    ``k``, the alignment width ``d`` and strategy, the step-credit weight, R_S's weights and format
    gate, and the advantage estimator's name."""

    k: int
    d: int
    strategy: str
    step_weight: float
    sub_weights: tuple[float, ...]
    estimator: str = "grpo_pooled_masked"
    sub_format_gate: bool = False


def rollout_keys(n: int, k: int) -> list[RolloutKey]:
    """The keys of ``n`` task-major rollouts in groups of ``k`` (rollout j of query q at q*k + j)."""
    if k < 1 or n % k:
        raise ValueError(f"{n} rollouts is not a multiple of K={k}")
    return [RolloutKey(i, i // k, i % k) for i in range(n)]


def score_main(rewards: Sequence[float], k: int, *, estimator: str = "grpo"
               ) -> tuple[list[RolloutKey], list[float], dict[str, float]]:
    """A_M of task-major rewards R_M by the estimator named ``estimator``: (keys, advantages, group stats)."""
    keys = rollout_keys(len(rewards), k)
    grid = np.asarray(rewards, dtype=np.float64).reshape(len(rewards) // k, k)
    adv = get_estimator(estimator)(grid)
    return keys, [float(adv[key.query, key.rollout]) for key in keys], group_stats(grid)


def score_sub(
    sub_rewards: Sequence[Sequence[float]], k: int, d: int, *, strategy: str, rng: np.random.Generator,
    estimator: str = "grpo_pooled_masked",
) -> tuple[list[tuple[RolloutKey, int, int, float]], list[float], dict[str, float]]:
    """Align each rollout's sub-agents to exactly ``d`` slots, then pool A_S per query.

    Args:
        sub_rewards: R_S of each rollout's sub-agents (in delegation order), rollouts task-major.
        k: rollouts per query; d: slots per rollout; strategy, rng: :func:`mgrpo_env.align.plan`'s.
        estimator: the name of the advantage estimator over the [Q, K, d] slots and their mask.

    Returns:
        ``slots``: (rollout key, slot, sub-agent index, R_S) of every unmasked slot, in order (a
        duplicated sub-agent appears once per slot it fills; a rollout with no sub-agent gets d
        masked slots, which are not listed); ``advantages``: A_S of each slot; ``stats``: mean R_S
        over the slots and the alignment counts.
    """
    keys = rollout_keys(len(sub_rewards), k)
    b = len(keys) // k
    rewards = np.zeros((b, k, d))
    mask = np.zeros((b, k, d), dtype=bool)
    slots: list[tuple[RolloutKey, int, int, float]] = []
    totals = {"num_zero": 0, "num_duplicated_slots": 0, "num_dropped": 0, "num_masked_slots": 0}
    for q in range(b):
        group = keys[q * k: (q + 1) * k]
        plan, plan_stats = align.plan_with_stats([len(sub_rewards[key.index]) for key in group], d, strategy=strategy, rng=rng)
        for name in totals:
            totals[name] += getattr(plan_stats, name)
        for key, row in zip(group, plan, strict=True):
            for s, sub in enumerate(row):
                if sub is not None:
                    value = float(sub_rewards[key.index][sub])
                    rewards[q, key.rollout, s] = value
                    mask[q, key.rollout, s] = True
                    slots.append((key, s, sub, value))
    adv = get_estimator(estimator)(rewards, mask)
    values = [float(adv[key.query, key.rollout, s]) for key, s, _, _ in slots]
    stats = {"reward_mean": float(rewards[mask].mean()) if mask.any() else 0.0, **{n: float(v) for n, v in totals.items()}}
    return slots, values, stats


def alignment_width(observed_counts: Sequence[int], align_d: int, quantile: float) -> int:
    """d: ``align_d`` when set, else the smallest d covering ``quantile`` of the last
    :data:`COUNT_WINDOW` observed sub-agent counts (:func:`mgrpo_env.align.choose_d`)."""
    return align_d or align.choose_d(list(observed_counts)[-COUNT_WINDOW:], quantile)


def anchor_state(chat: Sequence[Mapping[str, Any]]) -> str:
    """The one anchor state of a turn: a digest of the chat it had read (every message before its own,
    as (role, content)). The sub worker keys each request by it when it acts; :func:`turn_states` keys
    a recorded trajectory's turns by it; equal chats, equal states."""
    return hashlib.sha256(json.dumps([[m.get("role"), m.get("content")] for m in chat]).encode()).hexdigest()


def turn_states(trajectory: Any) -> list[Any]:
    """One anchor state per turn of ``trajectory`` (:func:`anchor_state` of the chat before each of its
    assistant messages). Two turns with equal keys were sampled from the same state. A trajectory
    whose messages do not line up with its turns gets keys no other turn shares."""
    messages = list(getattr(trajectory, "messages", None) or [])
    starts = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    if len(starts) != len(trajectory.turns):
        return [("unaligned", id(trajectory), t) for t in range(len(trajectory.turns))]
    return [anchor_state(messages[:i]) for i in starts]


def _step_credit(groups: Iterable[Sequence[tuple[Any, Sequence[Any], float]]]) -> dict[Any, list[float]]:
    """Per-turn step advantages: ``groups`` holds, per query, ``(owner, turn states, return)`` of every
    trajectory whose turns may share anchor states (:func:`turn_states`); the result maps each owner to
    one value per turn."""
    out: dict[Any, list[float]] = {}
    for group in groups:
        anchors, returns, owners = [], [], []
        for owner, states, ret in group:
            out[owner] = []
            for key in states:
                anchors.append(key)
                returns.append(float(ret))
                owners.append(owner)
        for owner, value in zip(owners, step_advantages(anchors, returns), strict=True):
            out[owner].append(value)
    return out


def _plus_steps(advantage: float, steps: Sequence[float] | None, weight: float) -> tuple[float, ...] | None:
    """A trajectory's per-turn advantages: ``advantage + weight * step`` (None without step credit)."""
    return None if steps is None else tuple(advantage + weight * v for v in steps)


def score_main_side(records: Sequence[EpisodeRecord], k: int, *, role: str = "main", step_weight: float = 0.0,
                    estimator: str = "grpo") -> tuple[list[MainSlot], dict[str, float]]:
    """The main (or single-agent, ``role="single"``) side: A_M per query over its K rollouts, read
    from the R_M the env paid; with ``step_weight`` w > 0 each turn also gets w x its step advantage
    over the query's K main trajectories."""
    agent = f"{role}_0"
    keys, a_main, stats = score_main([r.rewards[agent] for r in records], k, estimator=estimator)
    queries = [range(q * k, (q + 1) * k) for q in range(len(records) // k)]
    main_steps = _step_credit([(i, turn_states(records[i].main), records[i].rewards[agent]) for i in rows]
                              for rows in queries) if step_weight else {}
    main = [
        MainSlot(key, agent, float(records[key.index].rewards[agent]), a, float(records[key.index].correct),
                 bool(records[key.index].main.format_ok), _plus_steps(a, main_steps.get(key.index), step_weight))
        for key, a in zip(keys, a_main, strict=True)
    ]
    metrics = {
        f"{role}/reward_mean": float(np.mean([s.reward for s in main])),
        f"{role}/accuracy": float(np.mean([s.correct for s in main])),
        f"{role}/format_ok": float(np.mean([s.format_ok for s in main])),
        f"{role}/zero_std_groups": stats["zero_std_frac"],
    }
    return main, metrics


def sub_facts(records: Sequence[EpisodeRecord]) -> list[list[SubFact]]:
    """What the sub side knows of its own trajectories (:class:`SubFact`), per rollout in delegation order."""
    return [[SubFact(s.agent, bool(s.format_ok), s.expert, r.components.get(s.agent, {}).get("expert_source"))
             for s in r.subs] for r in records]


def score_sub_side(
    facts: Sequence[Sequence[SubFact]], rewards: Sequence[Sequence[float]], k: int, d: int, *,
    strategy: str, rng: np.random.Generator, step_weight: float = 0.0,
    states: Mapping[tuple[int, int], Sequence[Any]] | None = None, estimator: str = "grpo_pooled_masked",
) -> tuple[list[SubSlot], dict[str, float]]:
    """The sub side: each rollout's sub-agents (``facts``, :func:`sub_facts`; their R_S ``rewards``)
    aligned to ``d`` slots, A_S pooled per query; with ``step_weight`` w > 0 each turn also gets w x
    its step advantage over all the query's sub-agents (``states[(rollout index, sub)]``: the turn
    states, :func:`turn_states`). Run by the sub worker on R_S it computed from the store's statistics."""
    placed, a_sub, align_stats = score_sub(rewards, k, d, strategy=strategy, rng=rng, estimator=estimator)
    queries = [range(q * k, (q + 1) * k) for q in range(len(facts) // k)]
    # a query's sub-agents, of all its rollouts, share anchor states (the same subtask, the same pages)
    sub_steps = _step_credit([((i, j), (states or {})[(i, j)], rewards[i][j]) for i in rows for j in range(len(facts[i]))]
                             for rows in queries) if step_weight else {}
    sub = [SubSlot(key, s, i, facts[key.index][i].agent, reward, a,
                   _plus_steps(a, sub_steps.get((key.index, i)), step_weight))
           for (key, s, i, reward), a in zip(placed, a_sub, strict=True)]
    subs = [f for row in facts for f in row]
    metrics = {
        "sub/reward_mean": align_stats.pop("reward_mean"),
        "sub/expert_mean": float(np.mean([f.expert or 0.0 for f in subs])) if subs else 0.0,
        "sub/format_ok": float(np.mean([f.format_ok for f in subs])) if subs else 0.0,
        **{f"align/{name}": value for name, value in align_stats.items()},
    }
    sources = [f.expert_source for f in subs if f.expert_source is not None]
    if sources:
        metrics["sub/expert_disabled"] = sources.count("none") / len(sources)
    return sub, metrics


def alignment_metrics(records: Sequence[EpisodeRecord], d: int) -> dict[str, float]:
    """d and the mean sub-agent count d_k of an iteration (the loop's side of the alignment)."""
    return {"align/d": float(d), "align/d_k_mean": float(np.mean([r.num_subs for r in records]))}


def annotate_main(records: Sequence[EpisodeRecord], slots: Sequence[MainSlot]) -> None:
    """Each main (or single) agent's A_M into its record's components."""
    for m in slots:
        records[m.key.index].components.setdefault(m.agent, {})["advantage"] = m.advantage


def annotate_sub(records: Sequence[EpisodeRecord], advantages: Sequence[tuple[int, str, float]]) -> None:
    """The sub worker's A_S, as it returns them (record index, agent, A_S) per aligned slot, into the
    records' components; a duplicated sub-agent repeats its original's advantage and counts its
    ``aligned_slots``."""
    for index, agent, advantage in advantages:
        comp = records[index].components.setdefault(agent, {})
        comp["advantage"] = advantage
        comp["aligned_slots"] = comp.get("aligned_slots", 0) + 1
