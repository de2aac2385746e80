"""The M-GRPO reward formulas (docs/design.md, "The method"), written once.

The env pays these as PettingZoo rewards at episode end (``episode_core``); the algorithm reads the same
functions where it scores a called role (``mgrpo_algo.training.roles``), so both sides compute the same numbers.

Main agent:  R_M = a1 * r_format + a2 * r_correct                       if its format is valid, else 0.
Sub-agent:   R_S = b1 * r_format + b2 * r_correct^main + b3 * r_expert  if its format is valid, else 0.

Extra terms (:data:`REWARD_TERMS`, not the paper's): a run adds ``weight x term(inputs)`` to a role's pay
for each term its config names (``reward_terms``), on a well-formed trajectory only, as the paper's terms.
``inputs`` are the agent's reward inputs the env emits at episode end (its ``components`` in the record:
``format_ok``, ``turns``, ``format_errors`` and, for the root, ``correct``, ``score``, ``delegations``; for a
called agent ``main_correct``, ``expert``, ``report_chars``). :func:`root_pay` and :func:`called_pay` are the
one composition of each side: the env pays with them and a called role's worker recomputes its side with
them from the store's statistics, so a new term is one registered function (examples/extend/new_reward_term.py).

r_format is 1 when the format is valid (the only case where it counts), r_correct and r_correct^main
are in [0, 1] (exact match gives 0/1, F1 or a judge gives a fraction), r_expert is a judge's score in
[0, 1]. r_correct^main is the main agent's correctness of the sub-trajectory's rollout. The weights
need not sum to 1; they must be finite and non-negative.

>>> main_reward(True, 1), main_reward(True, 0), main_reward(False, 1)
(1.0, 0.1, 0.0)
>>> round(sub_reward(True, 1, 0.5), 10)
0.75
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from mgrpo_tools.registry import Registry

__all__ = [
    "PAPER_MAIN_WEIGHTS",
    "PAPER_SUB_WEIGHTS",
    "main_reward",
    "sub_reward",
    "paid_sub_reward",
    "REWARD_TERMS",
    "terms_pay",
    "root_pay",
    "called_pay",
    "check_weights",
]

#: (a1, a2) of the paper: format, correctness.
PAPER_MAIN_WEIGHTS: tuple[float, float] = (0.1, 0.9)
#: (b1, b2, b3) of the paper: format, main's correctness, expert score ("the 0.4/0.5 balance is crucial").
PAPER_SUB_WEIGHTS: tuple[float, float, float] = (0.1, 0.4, 0.5)


def check_weights(weights: Sequence[float], n: int, name: str = "weights") -> tuple[float, ...]:
    """Return ``weights`` as a tuple of n floats; ValueError unless each is finite and >= 0."""
    try:
        values = tuple(float(w) for w in weights)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be {n} numbers, got {weights!r}") from exc
    if len(values) != n:
        raise ValueError(f"{name} must hold {n} numbers, got {len(values)}: {weights!r}")
    if not all(math.isfinite(w) and w >= 0.0 for w in values):
        raise ValueError(f"{name} must be finite and non-negative, got {weights!r}")
    return values


def _unit(value: float | bool, name: str) -> float:
    v = float(value)
    if not 0.0 <= v <= 1.0:  # also refuses NaN
        raise ValueError(f"{name} must be in [0, 1], got {value!r}")
    return v


def main_reward(
    format_ok: bool, correct: float | bool, weights: Sequence[float] = PAPER_MAIN_WEIGHTS
) -> float:
    """R_M = a1 + a2 * correct when ``format_ok``, else 0.

    Args:
        format_ok: the main trajectory followed the protocol on every turn.
        correct: r_correct in [0, 1].
        weights: (a1, a2).
    """
    a1, a2 = check_weights(weights, 2, "main weights")
    c = _unit(correct, "correct")
    return a1 + a2 * c if format_ok else 0.0


def sub_reward(
    format_ok: bool,
    main_correct: float | bool,
    expert: float,
    weights: Sequence[float] = PAPER_SUB_WEIGHTS,
) -> float:
    """R_S = b1 + b2 * main_correct + b3 * expert when ``format_ok``, else 0.

    Args:
        format_ok: the sub trajectory followed the protocol on every turn.
        main_correct: r_correct of the main agent in the same rollout, in [0, 1].
        expert: the judge's score of the subtask, in [0, 1].
        weights: (b1, b2, b3).
    """
    b1, b2, b3 = check_weights(weights, 3, "sub weights")
    m = _unit(main_correct, "main_correct")
    e = _unit(expert, "expert")
    return b1 + b2 * m + b3 * e if format_ok else 0.0


def paid_sub_reward(format_ok: bool, main_correct: float | bool, expert: float | None,
                    weights: Sequence[float] = PAPER_SUB_WEIGHTS, *, format_gate: bool = False) -> float:
    """R_S as it is paid: :func:`sub_reward`, with no expert term when there is no expert score (``None``:
    no judge, or nothing to judge by; b3 x 0, the same float as leaving the term out). The env pays it at
    episode end and the sub worker computes it from the store's statistics: one rule for both.

    ``format_gate`` (not the paper's): the format term is paid in proportion to the expert score,
    b1 * r_format * r_expert, so a well-formed wrong report earns nothing for its form. Under the
    paper's R_S the sub-agents learned to report guesses (docs/results/demo.md, "Rewards that do not pay guessing").
    Without an expert score there is nothing to gate by and b1 is paid as in the paper.

    >>> paid_sub_reward(True, 0, 0.0), paid_sub_reward(True, 0, 0.0, format_gate=True)
    (0.1, 0.0)
    >>> round(paid_sub_reward(True, 1, 1.0, format_gate=True), 10), paid_sub_reward(True, 0, None, format_gate=True)
    (1.0, 0.1)
    """
    b1, b2, b3 = check_weights(weights, 3, "sub weights")
    if expert is not None and format_gate:
        b1 *= _unit(expert, "expert")
    return sub_reward(format_ok, main_correct, 0.0 if expert is None else expert, (b1, b2, b3))


#: Extra reward terms by name: ``term(inputs) -> float``, ``inputs`` an agent's reward inputs (module
#: docstring). A run names the ones it pays per role, with their weights (``reward_terms``).
REWARD_TERMS: Registry[Callable[[Mapping[str, Any]], float]] = Registry("reward term")


def terms_pay(terms: Sequence[tuple[str, float]], inputs: Mapping[str, Any]) -> float:
    """The extra terms of a pay: the sum of ``weight x term(inputs)`` over ``terms`` ((name, weight) pairs,
    in order) when ``inputs["format_ok"]``, else 0 (a malformed trajectory is paid nothing, as in the paper).
    A term must give a finite number: ValueError naming it otherwise.

    >>> REWARD_TERMS.register("half_turns", lambda inputs: inputs["turns"] / 2)  # doctest: +ELLIPSIS
    <function <lambda> at ...>
    >>> terms_pay([("half_turns", 0.1)], {"format_ok": True, "turns": 3}), terms_pay([("half_turns", 0.1)], {"format_ok": False, "turns": 3})
    (0.15000000000000002, 0.0)
    >>> REWARD_TERMS.unregister("half_turns")
    """
    if not terms or not inputs.get("format_ok"):
        return 0.0
    total = 0.0
    for name, weight in terms:
        value = float(REWARD_TERMS.get(name)(inputs))
        if not math.isfinite(value):
            raise ValueError(f"reward term {name!r} gave {value!r}: a term must give a finite number")
        total += weight * value
    return total


def root_pay(inputs: Mapping[str, Any], weights: Sequence[float] = PAPER_MAIN_WEIGHTS,
             terms: Sequence[tuple[str, float]] = ()) -> float:
    """What the root agent (main or single) is paid: R_M (:func:`main_reward`) plus its extra terms."""
    return main_reward(bool(inputs["format_ok"]), inputs["correct"], weights) + terms_pay(terms, inputs)


def called_pay(reward: Callable[..., float], inputs: Mapping[str, Any], weights: Sequence[float] = PAPER_SUB_WEIGHTS,
               *, format_gate: bool = False, terms: Sequence[tuple[str, float]] = ()) -> float:
    """What a called agent is paid: its role's ``reward`` (``mgrpo_env.roles.RoleSpec.reward``, R_S for the
    sub-agents) of its format, the main agent's correctness and its expert score, plus its extra terms."""
    base = reward(bool(inputs["format_ok"]), inputs["main_correct"], inputs["expert"], weights, format_gate=format_gate)
    return base + terms_pay(terms, inputs)
