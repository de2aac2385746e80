"""Advantages: hand-computed values, a plain-loop reference, masks and the estimator registry."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mgrpo_algo.core import advantages as adv_mod
from mgrpo_algo.core.advantages import (
    ESTIMATORS,
    get_estimator,
    group_stats,
    main_advantages,
    register_estimator,
    sub_advantages,
)


def loop_reference(rewards, mask=None, eps=1e-6):
    """Plain Python: per query, pool every unmasked entry after the first axis, population std."""
    r = np.asarray(rewards, dtype=np.float64)
    m = np.ones_like(r, dtype=bool) if mask is None else np.asarray(mask).astype(bool)
    out = np.zeros_like(r)
    for q in range(r.shape[0]):
        vals = [float(x) for x, keep in zip(r[q].ravel(), m[q].ravel(), strict=True) if keep]
        if not vals:
            continue
        mean = sum(vals) / len(vals)
        std = math.sqrt(sum((v - mean) ** 2 for v in vals) / len(vals))
        if std < eps:
            continue
        flat = out[q].reshape(-1)
        for i, (x, keep) in enumerate(zip(r[q].ravel(), m[q].ravel(), strict=True)):
            if keep:
                flat[i] = (x - mean) / std
        out[q] = flat.reshape(out[q].shape)
    return out


def test_main_hand_values():
    # mean 0.5, population std 0.5 -> (r - 0.5) / 0.5
    a = main_advantages([[1, 0, 0, 1]])
    assert a.dtype == torch.float32
    assert a.tolist() == [[1.0, -1.0, -1.0, 1.0]]
    # mean 0.25, std sqrt(0.1875): 0.75 / 0.4330 = 1.7321, -0.25 / 0.4330 = -0.5774
    a = main_advantages(np.array([[1.0, 0.0, 0.0, 0.0]]))
    torch.testing.assert_close(
        a, torch.tensor([[math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3)]])
    )


def test_main_zero_std_is_exactly_zero():
    a = main_advantages([[0.5, 0.5, 0.5], [0.1, 0.1, 0.1], [1.0, 1.0 + 1e-9, 1.0]])
    assert torch.equal(a, torch.zeros(3, 3))
    assert not torch.isnan(a).any()


def test_main_groups_are_independent():
    a = main_advantages(torch.tensor([[1.0, 0.0], [3.0, 3.0], [0.0, 2.0]]))
    assert a.tolist() == [[1.0, -1.0], [0.0, 0.0], [-1.0, 1.0]]


def test_main_mask_excludes_absent_rollouts():
    # Query 0: present [1, 0, 0] (slot 3 holds 100 but is absent): mean 1/3, std sqrt(2)/3.
    #   1 -> (2/3) / (sqrt(2)/3) = sqrt(2); 0 -> (-1/3) / (sqrt(2)/3) = -1/sqrt(2); absent -> 0.
    a = main_advantages([[1.0, 0.0, 0.0, 100.0]], mask=[[1, 1, 1, 0]])
    s2 = math.sqrt(2)
    torch.testing.assert_close(a, torch.tensor([[s2, -1 / s2, -1 / s2, 0.0]]))


def test_main_rejects_wrong_rank():
    with pytest.raises(ValueError):
        main_advantages([1.0, 0.0])
    with pytest.raises(ValueError):
        main_advantages([[1.0, 0.0]], mask=[[1, 1, 1]])


def test_sub_mixed_example_by_hand():
    # One query, K = 2 rollouts, d = 2 slots each, rewards after alignment:
    #   rollout 0: [0.9, 0.9]  (one sub-trajectory duplicated: both slots count)
    #   rollout 1: [0.1, <masked, holds 7.0>]
    # Pool = {0.9, 0.9, 0.1}: mean = 1.9 / 3 = 0.63333, deviations 0.26667, 0.26667, -0.53333,
    # var = (2 * 0.071111 + 0.284444) / 3 = 0.142222, std = 0.377124.
    # A = 0.26667 / 0.377124 = 0.707107 (= 1/sqrt 2) for the 0.9s, -0.53333 / 0.377124 = -1.414214.
    rewards = [[[0.9, 0.9], [0.1, 7.0]]]
    mask = [[[True, True], [True, False]]]
    a = sub_advantages(rewards, mask)
    s2 = math.sqrt(2)
    torch.testing.assert_close(a, torch.tensor([[[1 / s2, 1 / s2], [-s2, 0.0]]]))


def test_sub_all_masked_query_and_nan_padding():
    rewards = torch.tensor([[[1.0, float("nan")], [0.0, 1.0]], [[float("nan"), 5.0], [3.0, 2.0]]])
    mask = torch.tensor([[[1, 0], [1, 1]], [[0, 0], [0, 0]]])
    a = sub_advantages(rewards, mask)
    assert not torch.isnan(a).any()
    assert torch.equal(a[1], torch.zeros(2, 2))
    torch.testing.assert_close(
        a[0], torch.tensor(loop_reference(rewards[:1].numpy(), mask[:1].numpy())[0], dtype=torch.float32)
    )


def test_sub_duplicates_count_as_often_as_they_appear():
    # Duplicating the 1.0 shifts the pooled mean: {1, 1, 0} differs from {1, 0}.
    once = sub_advantages([[[1.0, 0.0]]], [[[1, 1]]])
    twice = sub_advantages([[[1.0, 1.0, 0.0]]], [[[1, 1, 1]]])
    assert once.tolist() == [[[1.0, -1.0]]]
    torch.testing.assert_close(twice, torch.tensor([[[1 / math.sqrt(2), 1 / math.sqrt(2), -math.sqrt(2)]]]))


def test_sub_without_mask_and_zero_std():
    assert torch.equal(sub_advantages(torch.full((2, 3, 4), 0.7)), torch.zeros(2, 3, 4))


@settings(max_examples=60, deadline=None)
@given(
    q=st.integers(0, 4),
    k=st.integers(1, 5),
    d=st.integers(1, 4),
    seed=st.integers(0, 2**31 - 1),
    discrete=st.booleans(),
)
def test_sub_matches_loop_reference(q, k, d, seed, discrete):
    rng = np.random.default_rng(seed)
    # Discrete rewards make zero-std groups and ties common, which is where bugs hide.
    rewards = rng.integers(0, 2, size=(q, k, d)).astype(float) if discrete else rng.normal(size=(q, k, d))
    mask = rng.random((q, k, d)) < 0.7
    got = sub_advantages(rewards, mask)
    assert got.shape == (q, k, d)
    np.testing.assert_allclose(got.numpy(), loop_reference(rewards, mask), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("seed", range(5))
def test_main_matches_loop_reference(seed):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randint(0, 3, (6, 8), generator=g).double() / 2
    mask = torch.rand(6, 8, generator=g) < 0.8
    np.testing.assert_allclose(
        main_advantages(rewards, mask).numpy(), loop_reference(rewards, mask), rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(
        main_advantages(rewards).numpy(), loop_reference(rewards), rtol=1e-5, atol=1e-6
    )


def test_unmasked_advantages_have_zero_mean_unit_std():
    a = main_advantages(torch.randn(10, 8, generator=torch.Generator().manual_seed(0)))
    torch.testing.assert_close(a.mean(1), torch.zeros(10), atol=1e-5, rtol=0)
    torch.testing.assert_close(a.std(1, unbiased=False), torch.ones(10))


def test_registry():
    assert get_estimator("grpo") is main_advantages
    assert get_estimator("grpo_pooled_masked") is sub_advantages
    with pytest.raises(KeyError, match="grpo_pooled_masked"):
        get_estimator("nope")
    with pytest.raises(ValueError, match="already registered"):
        register_estimator("grpo")(lambda rewards, mask=None: rewards)
    try:
        register_estimator("test-only")(main_advantages)
        assert get_estimator("test-only") is main_advantages
    finally:
        adv_mod.ESTIMATORS.unregister("test-only")
    assert "test-only" not in ESTIMATORS


def test_group_stats():
    # Groups: {1, 0} std 0.5; {1, 1} std 0 (zero); {x, x} all masked (zero, no std).
    stats = group_stats([[1.0, 0.0], [1.0, 1.0], [9.0, 9.0]], mask=[[1, 1], [1, 1], [0, 0]])
    assert stats == {"mean": 0.75, "std": 0.25, "zero_std_frac": 2 / 3, "num_groups": 3.0}
    assert group_stats(np.zeros((0, 4))) == {"mean": 0.0, "std": 0.0, "zero_std_frac": 0.0, "num_groups": 0.0}
    assert all(isinstance(v, float) for v in group_stats(torch.rand(2, 3, 4)).values())


def test_score_sub_by_hand():
    import numpy as np

    from mgrpo_algo.core.scoring import RolloutKey, score_sub

    # one query, K = 2: rollout 0 has subs with R_S 1.0 and 0.5, rollout 1 has none; d = 2
    slots, values, stats = score_sub([[1.0, 0.5], []], 2, 2, strategy="duplicate", rng=np.random.default_rng(0))
    assert slots == [(RolloutKey(0, 0, 0), 0, 0, 1.0), (RolloutKey(0, 0, 0), 1, 1, 0.5)]  # rollout 1's slots are masked
    # pooled over the two unmasked slots: mean 0.75, population std 0.25 -> +1, -1
    assert values == pytest.approx([1.0, -1.0])
    assert stats["reward_mean"] == 0.75 and stats["num_masked_slots"] == 2 and stats["num_zero"] == 1


# --- found by mutation testing (benchmarks/mutation.py) ---


@pytest.mark.parametrize("make", [lambda x: torch.tensor(x, dtype=torch.float32),
                                  lambda x: np.asarray(x, dtype=np.float32)])
def test_statistics_in_float64_even_for_float32_input(make):
    # 2^24 + {0, 2, 2, 2}: exact in float32, but a float32 sum rounds the mean to 2^24 (adv 0, 1.15, ...).
    # In float64: mean 2^24 + 1.5, population std sqrt(.75) -> -sqrt 3, 1/sqrt 3 (three times).
    x = [[2.0**24, 2.0**24 + 2, 2.0**24 + 2, 2.0**24 + 2]]
    expected = [-math.sqrt(3), 1 / math.sqrt(3), 1 / math.sqrt(3), 1 / math.sqrt(3)]
    assert main_advantages(make(x))[0].tolist() == pytest.approx(expected, rel=1e-6)
    assert sub_advantages(make(x))[0].tolist() == pytest.approx(expected, rel=1e-6)


def test_eps_boundary_is_signal():
    # population std of {0, 2} is exactly 1: std >= eps carries signal, std < eps does not
    assert main_advantages([[0.0, 2.0]], eps=1.0).tolist() == [[-1.0, 1.0]]
    assert main_advantages([[0.0, 2.0]], eps=1.0 + 1e-9).tolist() == [[0.0, 0.0]]
    assert sub_advantages([[[0.0], [2.0]]], eps=1.0).tolist() == [[[-1.0], [1.0]]]
    assert group_stats([[0.0, 2.0]], eps=1.0)["zero_std_frac"] == 0.0
    assert group_stats([[0.0, 2.0]], eps=1.0 + 1e-9)["zero_std_frac"] == 1.0


def test_group_stats_counts_single_entry_groups():
    # group 0 has one unmasked entry (std 0, counted), group 1 {0, 1} std .5: mean std .25
    stats = group_stats([[5.0, 7.0], [0.0, 1.0]], mask=[[1, 0], [1, 1]])
    assert stats["std"] == 0.25 and stats["mean"] == 2.0 and stats["zero_std_frac"] == 0.5


def test_shape_errors_name_the_shape():
    with pytest.raises(ValueError, match=r"^mask has shape \(1, 3\) but rewards have shape \(1, 2\)$"):
        main_advantages([[1.0, 0.0]], mask=[[1, 1, 1]])
    with pytest.raises(ValueError, match=r"^sub_advantages expects rewards with at least 2 axes, got shape \(3,\)$"):
        sub_advantages([1.0, 0.0, 1.0])
    with pytest.raises(ValueError, match=r"^group_stats expects rewards \[Q, \.\.\.\], got shape \(2,\)$"):
        group_stats([1.0, 0.0])
