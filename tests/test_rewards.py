"""Reward formulas: hand-computed values, validation, vectorised == scalar loop."""

import doctest
import itertools

import pytest

from mgrpo_env import rewards
from mgrpo_env.rewards import (
    PAPER_MAIN_WEIGHTS,
    PAPER_SUB_WEIGHTS,
    main_reward,
    sub_reward,
)


def test_doctests():
    assert doctest.testmod(rewards).failed == 0


def test_paper_weights():
    assert PAPER_MAIN_WEIGHTS == (0.1, 0.9)
    assert PAPER_SUB_WEIGHTS == (0.1, 0.4, 0.5)


def test_main_reward_by_hand():
    assert main_reward(True, 1) == 1.0
    assert main_reward(True, True) == 1.0
    assert main_reward(True, 0) == 0.1
    assert main_reward(True, 0.5) == pytest.approx(0.1 + 0.45)
    assert main_reward(False, 1) == 0.0
    assert main_reward(False, 0) == 0.0
    assert main_reward(True, 1, weights=(0.0, 1.0)) == 1.0
    assert main_reward(True, 0.5, weights=[2, 4]) == 4.0


def test_sub_reward_by_hand():
    assert sub_reward(True, 1, 0.5) == 0.1 + 0.4 + 0.25
    assert sub_reward(True, 0, 0) == 0.1
    assert sub_reward(True, 1, 1) == pytest.approx(1.0)
    assert sub_reward(True, False, 1.0) == pytest.approx(0.6)
    assert sub_reward(False, 1, 1) == 0.0
    assert sub_reward(True, 0.5, 0.5, weights=(1, 1, 1)) == 2.0


@pytest.mark.parametrize(
    "weights",
    [(0.1,), (0.1, 0.9, 0.0), (-0.1, 0.9), (0.1, float("nan")), (0.1, float("inf")), ("a", 1), None],
)
def test_main_bad_weights(weights):
    with pytest.raises(ValueError, match="main weights"):
        main_reward(True, 1, weights=weights)


@pytest.mark.parametrize("weights", [(0.1, 0.9), (0.1, -0.4, 0.5), (0.1, 0.4, float("nan"))])
def test_sub_bad_weights(weights):
    with pytest.raises(ValueError, match="sub weights"):
        sub_reward(True, 1, 0.5, weights=weights)


@pytest.mark.parametrize("bad", [-0.1, 1.1, float("nan")])
def test_values_out_of_range(bad):
    with pytest.raises(ValueError, match="expert"):
        sub_reward(True, 1, bad)
    with pytest.raises(ValueError, match="main_correct"):
        sub_reward(True, bad, 0.5)
    with pytest.raises(ValueError, match="correct"):
        main_reward(True, bad)


def test_out_of_range_checked_even_when_format_invalid():
    # a bad input is a caller bug whatever the format flag says
    with pytest.raises(ValueError):
        sub_reward(False, 1, 2.0)


def test_a_grid_of_inputs_against_the_formula_by_hand():
    w = (0.2, 0.3, 0.5)
    for ok, m, e in itertools.product([False, True], [0.0, 0.3, 1.0], [0.0, 0.7, 1.0]):
        assert sub_reward(ok, m, e, weights=w) == pytest.approx((0.2 + 0.3 * m + 0.5 * e) if ok else 0.0)
        assert main_reward(ok, m, (0.5, 0.5)) == pytest.approx((0.5 + 0.5 * m) if ok else 0.0)


def test_env_modules_never_import_torch():
    import subprocess
    import sys

    code = (
        "import sys, mgrpo_env.protocol, mgrpo_env.align, mgrpo_env.rewards; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# --- found by mutation testing (benchmarks/mutation.py): messages name the argument at their start ---


def test_messages_name_the_argument():
    with pytest.raises(ValueError, match=r"^weights must hold 2 numbers, got 1"):
        rewards.check_weights([1.0], 2)
    with pytest.raises(ValueError, match=r"^main weights must hold 2"):
        main_reward(True, 1, weights=(0.1,))
    with pytest.raises(ValueError, match=r"^sub weights must hold 3"):
        sub_reward(True, 1, 1, weights=(0.1,))
    with pytest.raises(ValueError, match=r"^correct must be in \[0, 1\], got 2"):
        main_reward(True, 2)
    with pytest.raises(ValueError, match=r"^main_correct must be in \[0, 1\], got 2"):
        sub_reward(True, 2, 1)
    with pytest.raises(ValueError, match=r"^expert must be in \[0, 1\], got 2"):
        sub_reward(True, 1, 2)


def test_extra_terms_are_paid_on_a_well_formed_trajectory_only_and_must_be_finite():
    from mgrpo_env.rewards import REWARD_TERMS, called_pay, paid_sub_reward, root_pay, terms_pay

    REWARD_TERMS.register("per_turn", lambda inputs: inputs["turns"])
    REWARD_TERMS.register("broken", lambda inputs: float("nan"))
    try:
        ok = {"format_ok": True, "correct": 1.0, "turns": 3}
        assert terms_pay([], ok) == 0.0
        assert terms_pay([("per_turn", 0.5), ("per_turn", -0.25)], ok) == 0.75  # 1.5 - 0.75, in order
        assert terms_pay([("per_turn", 0.5)], {**ok, "format_ok": False}) == 0.0
        assert root_pay(ok, (0.1, 0.9), [("per_turn", 0.5)]) == 1.0 + 1.5
        assert root_pay({**ok, "format_ok": False}, (0.1, 0.9), [("per_turn", 0.5)]) == 0.0
        called = {"format_ok": True, "main_correct": 0.0, "expert": 1.0, "turns": 2}
        assert called_pay(paid_sub_reward, called, (0.1, 0.4, 0.5), terms=[("per_turn", 0.1)]) == pytest.approx(0.6 + 0.2)
        assert called_pay(paid_sub_reward, called, (0.1, 0.4, 0.5), format_gate=True) == pytest.approx(0.6)
        unjudged = {"format_ok": True, "main_correct": 0.0, "expert": 0.0}
        assert called_pay(paid_sub_reward, unjudged, (0.1, 0.4, 0.5)) == 0.1  # ungated unless asked (the paper)
        assert called_pay(paid_sub_reward, unjudged, (0.1, 0.4, 0.5), format_gate=True) == 0.0
        with pytest.raises(ValueError, match="reward term 'broken' gave nan"):
            terms_pay([("broken", 1.0)], ok)
        with pytest.raises(KeyError, match="unknown reward term 'missing'; valid: .*per_turn"):
            terms_pay([("missing", 1.0)], ok)
    finally:
        REWARD_TERMS.unregister("per_turn")
        REWARD_TERMS.unregister("broken")


def test_the_config_refuses_an_unknown_term_role_or_weight():
    from mgrpo_algo.core.config import load_config
    from mgrpo_env.rewards import REWARD_TERMS

    REWARD_TERMS.register("per_turn", lambda inputs: inputs["turns"])
    try:
        config = load_config(None, ["reward_terms={sub: {per_turn: 0.5}, main: {per_turn: 1}}"])
        assert config.role_terms("sub") == (("per_turn", 0.5),) and config.role_terms("single") == ()
        for bad, said in (("{sub: {nope: 1}}", "reward_terms.sub.nope': unknown reward term 'nope'"),
                          ("{nobody: {per_turn: 1}}", "names roles of"),
                          ("{sub: {per_turn: .nan}}", "must be a finite number"),
                          ("{sub: {per_turn: true}}", "must be a finite number")):
            with pytest.raises(ValueError, match=said):
                load_config(None, [f"reward_terms={bad}"])
    finally:
        REWARD_TERMS.unregister("per_turn")
