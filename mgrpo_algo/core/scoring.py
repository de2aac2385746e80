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
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mgrpo_env import align
from mgrpo_env.attribution import delegation_judgements
from mgrpo_env.core import SUBTASK_FELL_BACK
from mgrpo_env.episode import EpisodeRecord

from .advantages import get_estimator, group_stats, step_advantages

__all__ = [
    "COUNT_WINDOW",
    "RolloutKey",
    "MainSlot",
    "CalledSlot",
    "RoleBatch",
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
    "CalledFact",
    "CalledScoring",
    "TurnCredit",
    "turn_credit",
    "OUTCOME_GROUPS",
    "penalised_turns",
    "credited_turns",
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
class CalledSlot:
    """One aligned slot of a called role (the sub-agents, or a registered role): ``slot`` of rollout ``key``
    holds agent ``agent`` (its ``sub``-th delegation). A duplicated agent fills several slots, each a sample."""

    key: RolloutKey
    slot: int
    sub: int
    agent: str
    reward: float
    advantage: float
    turn_advantages: tuple[float, ...] | None = None
    """Per turn: ``advantage`` + w x the sub-agent's step advantage (``step_weight`` > 0), else None."""


#: How the sub side's outcome term A_S is grouped (:func:`score_sub_side`; ``mgrpo_env.align``'s).
OUTCOME_GROUPS = align.OUTCOME_GROUPS


@dataclass(frozen=True)
class TurnCredit:
    """Credit on a trajectory's own tokens, added to its advantages after the group standardisation
    (so it is not divided by a group's spread, and it moves nothing else in the group).

    ``format_penalty`` c: every turn :func:`penalised_turns` names (a malformed turn; the last turn of an
    agent that ended without its result or answer) carries ``advantage - c``. The other turns of the
    same trajectory, and every turn of a well-formed guess, are untouched: the penalty cannot make a
    guess worth more than a research path, it only makes a broken turn worth less than any well-formed one.

    ``success_likelihood`` lam: every sampled token of a successful trajectory (a correct main answer;
    a sub-agent's report, weighted by its own expert score) carries ``advantage + lam``. Under the paper's
    single on-policy step (``ppo_epochs`` = ``minibatches`` = 1, ratio 1) this is exactly the gradient
    of lam x the trajectory's negative log-likelihood in the loss: a likelihood regulariser on the
    trajectories that succeeded (arXiv 2512.04220 traces GRPO's collapse in multi-turn search to
    their falling likelihood). It holds even in a group whose rollouts all succeeded, where GRPO's
    own advantage is 0. All 0: the paper.

    ``delegation`` w_d (the judged delegation credit, off in the paper): each delegating turn of the main
    agent carries ``advantage + w_d`` when it asks a hop the task still needs and ``advantage - w_d`` when
    it does not (:func:`mgrpo_env.attribution.delegation_judgements`, from the task's gold hops): the
    main agent's analogue of the sub-agents' expert score, on the delegating turn's own tokens.
    """

    format_penalty: float = 0.0
    success_likelihood: float = 0.0
    delegation: float = 0.0

    def __post_init__(self) -> None:
        for name in ("format_penalty", "success_likelihood", "delegation"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and value >= 0 and np.isfinite(value)):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")

    @property
    def active(self) -> bool:
        return bool(self.format_penalty or self.success_likelihood or self.delegation)


def turn_credit(config: Any) -> TurnCredit:
    """The :class:`TurnCredit` a run config asks for (``turn_format_penalty``, ``success_likelihood``,
    ``delegation_credit``)."""
    return TurnCredit(float(config.turn_format_penalty), float(config.success_likelihood),
                      float(config.delegation_credit))


def penalised_turns(trajectory: Any) -> tuple[int, ...]:
    """The turns a format penalty falls on: each malformed turn (``kind == "error"``) and, when the
    agent ended without its final (``final`` None: a turn limit), its last turn."""
    turns = list(trajectory.turns)  # no default: a trajectory without turns is a wiring error, not "no penalty"
    out = [i for i, turn in enumerate(turns) if turn.kind == "error"]
    if turns and trajectory.final is None and (len(turns) - 1) not in out:
        out.append(len(turns) - 1)
    return tuple(out)


def credited_turns(base: float, steps: Sequence[float] | None, step_weight: float, num_turns: int,
                   penalised: Sequence[int], success: float, credit: TurnCredit,
                   judged: Sequence[float | None] | None = None) -> tuple[float, ...] | None:
    """One trajectory's per-turn advantages: ``base + w x step`` (:func:`_plus_steps`), then ``credit``'s
    terms (``judged``: per turn, a delegation's judgement in [0, 1] or None, for ``credit.delegation``);
    None when there is neither step credit nor an active ``credit`` (one advantage per trajectory)."""
    turns = _plus_steps(base, steps, step_weight)
    if not credit.active or num_turns <= 0:
        return turns
    values = list(turns) if turns is not None else [base] * num_turns
    if len(values) != num_turns:
        raise ValueError(f"{len(values)} turn advantages for {num_turns} turns")
    if judged is not None and len(judged) != num_turns:
        raise ValueError(f"{len(judged)} delegation judgements for {num_turns} turns")
    bad = set(penalised)
    judged = judged if judged is not None else [None] * num_turns
    return tuple(v + credit.success_likelihood * success - (credit.format_penalty if t in bad else 0.0)
                 + (0.0 if judged[t] is None else credit.delegation * (2.0 * float(judged[t]) - 1.0))
                 for t, v in enumerate(values))


@dataclass(frozen=True)
class CalledFact:
    """What a called role's side (the sub-agents, or a registered role) knows of one of its trajectories before
    the main statistics arrive: the agent, its format flag and expert score (None: no judge, b3 = 0) and where
    that score came from. A few bytes, no tokens: the loop sends these, the worker's trajectories hold the rest."""

    agent: str
    format_ok: bool
    expert: float | None
    expert_source: str | None = None
    turns: int = 0
    """How many turns the sub-agent took (0: unknown, no turn-level credit)."""
    penalised_turns: tuple[int, ...] = ()
    """Its turns that :func:`penalised_turns` names: malformed, or the last one of a sub-agent that
    ended without a result."""
    subtask: str = ""
    """A digest of the subtask it was given (``outcome_groups: subtask`` groups by it)."""
    inputs: Mapping[str, Any] = field(default_factory=dict)
    """Its reward inputs as the env emitted them (``mgrpo_env.rewards``), but the main agent's correctness,
    which its side reads from the main statistics: what a run's extra reward terms read."""


@dataclass(frozen=True)
class CalledScoring:
    """How a called role's side scores an iteration (:func:`score_sub_side` and the paid R_S): the group size
    ``k``, the alignment width ``d`` and strategy, the step-credit weight, R_S's weights and format
    gate, and the advantage estimator's name."""

    k: int
    d: int
    strategy: str
    step_weight: float
    sub_weights: tuple[float, ...]
    estimator: str = "grpo_pooled_masked"
    sub_format_gate: bool = False
    credit: TurnCredit = field(default_factory=TurnCredit)
    outcome_groups: str = "query"
    role: str = "sub"
    """The called role whose side this is (``mgrpo_env.roles``): its reward and its metrics' prefix."""
    terms: tuple[tuple[str, float], ...] = ()
    """Its extra reward terms ((name, weight) of ``mgrpo_env.rewards.REWARD_TERMS``), paid as the env paid them."""

    def __post_init__(self) -> None:
        if isinstance(self.credit, Mapping):  # a queued iteration read back from worker.json
            object.__setattr__(self, "credit", TurnCredit(**self.credit))
        object.__setattr__(self, "terms", tuple((str(name), float(weight)) for name, weight in self.terms))
        if self.outcome_groups not in OUTCOME_GROUPS:
            raise ValueError(f"outcome_groups must be one of {OUTCOME_GROUPS}, got {self.outcome_groups!r}")


@dataclass(frozen=True)
class RoleBatch:
    """One iteration's update for one role worker (``RoleWorker.update``): what its side brings.

    ``slots``: the side the loop scored (the root agent's :class:`MainSlot` s, whose statistics the
    worker publishes). ``facts`` and ``scoring``: a side that scores itself (a called role's
    :class:`CalledFact` s per rollout and how to score them, from the main statistics in the store; it
    lags them by ``staleness`` iterations at most). Both: one model plays both sides (the
    shared-model baseline), one update over both."""

    slots: list[MainSlot] | None = None
    facts: list[list[CalledFact]] | None = None
    scoring: CalledScoring | None = None
    staleness: int = 0

    def __post_init__(self) -> None:
        if (self.facts is None) != (self.scoring is None) or (self.slots is None and self.facts is None):
            raise ValueError("a role's batch brings slots, or facts with their scoring, or both")

    @property
    def scores_itself(self) -> bool:
        """The worker scores (part of) this batch from the store's main statistics."""
        return self.facts is not None


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
                    estimator: str = "grpo", credit: TurnCredit | None = None) -> tuple[list[MainSlot], dict[str, float]]:
    """The main (or single-agent, ``role="single"``) side: A_M per query over its K rollouts, read
    from the R_M the env paid; with ``step_weight`` w > 0 each turn also gets w x its step advantage
    over the query's K main trajectories; ``credit`` (:class:`TurnCredit`) adds its per-turn terms
    (the judged delegation credit on the main agent's delegating turns: not the single agent's, which
    delegates nothing)."""
    credit = credit or TurnCredit()
    judged = ([delegation_judgements(r) for r in records] if credit.delegation and role != "single"
              else [None] * len(records))
    agent = f"{role}_0"
    keys, a_main, stats = score_main([r.rewards[agent] for r in records], k, estimator=estimator)
    queries = [range(q * k, (q + 1) * k) for q in range(len(records) // k)]
    main_steps = _step_credit([(i, turn_states(records[i].main), records[i].rewards[agent]) for i in rows]
                              for rows in queries) if step_weight else {}
    def turns(i: int, a: float) -> tuple[float, ...] | None:
        record = records[i]
        success = float(record.correct) if record.main.format_ok else 0.0
        return credited_turns(a, main_steps.get(i), step_weight, len(record.main.turns), penalised_turns(record.main),
                              success, credit, judged[i])

    main = [
        MainSlot(key, agent, float(records[key.index].rewards[agent]), a, float(records[key.index].correct),
                 bool(records[key.index].main.format_ok), turns(key.index, a))
        for key, a in zip(keys, a_main, strict=True)
    ]
    metrics = {
        f"{role}/reward_mean": float(np.mean([s.reward for s in main])),
        f"{role}/accuracy": float(np.mean([s.correct for s in main])),
        f"{role}/format_ok": float(np.mean([s.format_ok for s in main])),
        f"{role}/zero_std_groups": stats["zero_std_frac"],
        # the turns a format penalty falls on (malformed, or the last of an episode that never answered)
        f"{role}/penalised_turns": float(np.mean([len(penalised_turns(r.main)) / max(1, len(r.main.turns)) for r in records])),
    }
    delegations = [v for turns in judged if turns for v in turns if v is not None]
    if delegations:  # the judged delegation credit's input: the share of delegations that asked a needed hop
        metrics[f"{role}/delegations_needed"] = float(np.mean(delegations))
    return main, metrics


def sub_facts(records: Sequence[EpisodeRecord], role: str = "sub") -> list[list[CalledFact]]:
    """What a called role's side (``role``: the sub-agents, or a registered one) knows of its own
    trajectories (:class:`CalledFact`), per rollout in call order."""
    return [[CalledFact(s.agent, bool(s.format_ok), s.expert, r.components.get(s.agent, {}).get("expert_source"),
                     len(s.turns), penalised_turns(s), _digest(s.task),
                     {k: v for k, v in r.components.get(s.agent, {}).items() if k not in NOT_INPUTS})
             for s in r.subs if s.role == role] for r in records]


#: What a called agent's components hold beside its reward inputs: its pay, its advantage, and the main
#: agent's correctness, which its side reads from the main statistics.
NOT_INPUTS = ("reward", "main_correct", "advantage", "aligned_slots")


def _digest(text: str | None) -> str:
    return hashlib.sha256((text or "").encode()).hexdigest()[:16]


def _subtask_groups(placed: Sequence[tuple[RolloutKey, int, int, float]], pooled: Sequence[float],
                    facts: Sequence[Sequence[CalledFact]]) -> list[float]:
    """A_S standardised within each (query, delegated subtask) group of aligned slots instead of the
    query's pool (:func:`step_advantages` over those keys: a group without spread gives 0): a sub-agent
    is compared with the sub-agents given the same subtask. A subtask that only one slot of the query
    holds has no peer to compare with and keeps its pooled A_S."""
    keys = [(key.query, facts[key.index][sub].subtask) for key, _, sub, _ in placed]
    grouped = step_advantages(keys, [value for *_, value in placed])
    sizes = Counter(keys)
    return [g if sizes[k] > 1 else p for k, g, p in zip(keys, grouped, pooled, strict=True)]


def score_sub_side(
    facts: Sequence[Sequence[CalledFact]], rewards: Sequence[Sequence[float]], k: int, d: int, *,
    strategy: str, rng: np.random.Generator, step_weight: float = 0.0,
    states: Mapping[tuple[int, int], Sequence[Any]] | None = None, estimator: str = "grpo_pooled_masked",
    credit: TurnCredit | None = None, outcome_groups: str = "query", role: str = "sub",
) -> tuple[list[CalledSlot], dict[str, float]]:
    """The sub side: each rollout's sub-agents (``facts``, :func:`sub_facts`; their R_S ``rewards``)
    aligned to ``d`` slots, A_S pooled per query; with ``step_weight`` w > 0 each turn also gets w x
    its step advantage over all the query's sub-agents (``states[(rollout index, sub)]``: the turn
    states, :func:`turn_states`). ``credit`` (:class:`TurnCredit`) adds its per-turn terms (a report's
    success is its expert score); ``outcome_groups`` "subtask" standardises A_S per delegated subtask
    (:func:`_subtask_groups`). Run by the sub worker (or any called ``role``'s: its metrics carry the
    role's name, its alignment figures ``<role>/align/``) on R_S it computed from the store's statistics."""
    credit = credit or TurnCredit()
    if outcome_groups not in OUTCOME_GROUPS:
        raise ValueError(f"outcome_groups must be one of {OUTCOME_GROUPS}, got {outcome_groups!r}")
    placed, a_sub, align_stats = score_sub(rewards, k, d, strategy=strategy, rng=rng, estimator=estimator)
    if outcome_groups == "subtask":
        a_sub = _subtask_groups(placed, a_sub, facts)
    queries = [range(q * k, (q + 1) * k) for q in range(len(facts) // k)]
    # a query's sub-agents, of all its rollouts, share anchor states (the same subtask, the same pages)
    sub_steps = _step_credit([((i, j), (states or {})[(i, j)], rewards[i][j]) for i in rows for j in range(len(facts[i]))]
                             for rows in queries) if step_weight else {}

    def turns(index: int, i: int, a: float) -> tuple[float, ...] | None:
        fact = facts[index][i]
        success = float(fact.expert or 0.0) if fact.format_ok else 0.0
        return credited_turns(a, sub_steps.get((index, i)), step_weight, fact.turns, fact.penalised_turns, success, credit)

    sub = [CalledSlot(key, s, i, facts[key.index][i].agent, reward, a, turns(key.index, i, a))
           for (key, s, i, reward), a in zip(placed, a_sub, strict=True)]
    subs = [f for row in facts for f in row]
    align_prefix = "align" if role == "sub" else f"{role}/align"
    metrics = {
        f"{role}/reward_mean": align_stats.pop("reward_mean"),
        f"{role}/expert_mean": float(np.mean([f.expert or 0.0 for f in subs])) if subs else 0.0,
        f"{role}/format_ok": float(np.mean([f.format_ok for f in subs])) if subs else 0.0,
        f"{role}/penalised_turns": float(np.mean([len(f.penalised_turns) / max(1, f.turns) for f in subs])) if subs else 0.0,
        **{f"{align_prefix}/{name}": value for name, value in align_stats.items()},
    }
    sources = [f.expert_source for f in subs if f.expert_source is not None]
    if sources:
        metrics[f"{role}/expert_disabled"] = sources.count("none") / len(sources)
        if any(s.startswith("subtask") for s in sources):  # expert_reference: subtask, its hop fallbacks counted
            metrics[f"{role}/expert_fell_back"] = sources.count(SUBTASK_FELL_BACK) / len(sources)
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
