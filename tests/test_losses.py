"""Clipped PG loss and aggregation: hand values, gradients, clipping, masks, micro-batches, loop reference."""

from __future__ import annotations

import math

import pytest
import torch

from mgrpo_algo.core import losses as losses_mod
from mgrpo_algo.core.losses import (
    AGGREGATIONS,
    aggregate,
    clipped_pg_loss,
    get_aggregation,
    loss_normalizer,
    register_aggregation,
)

MODES = ["seq-mean-token-mean", "token-mean", "seq-mean-token-sum"]

# B = 3 samples with 3, 1 and 4 sampled tokens.
MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
ADV = torch.tensor([1.0, -2.0, 0.5])


def _leaf(x: torch.Tensor) -> torch.Tensor:
    return x.clone().detach().requires_grad_(True)


@pytest.mark.parametrize(
    "mode, weight, expected",
    [
        # ratio 1 -> per-token loss -A_b.
        ("seq-mean-token-mean", None, -(1 - 2 + 0.5) / 3),  # mean over samples of -A
        ("token-mean", None, -(3 * 1 - 1 * 2 + 4 * 0.5) / 8),  # each token counts once
        ("seq-mean-token-sum", None, -(3 * 1 - 1 * 2 + 4 * 0.5) / 3),  # token sums, mean over samples
        ("seq-mean-token-mean", [1.0, 0.0, 1.0], -(1 + 0.5) / 2),  # sample 1 dropped
        ("token-mean", [1.0, 0.0, 1.0], -(3 + 2) / 7),
        ("seq-mean-token-sum", [1.0, 0.0, 1.0], -(3 + 2) / 2),
    ],
)
def test_ratio_one_loss_is_minus_mean_advantage(mode, weight, expected):
    logp = torch.full((3, 4), -1.3)
    w = None if weight is None else torch.tensor(weight)
    loss, metrics = clipped_pg_loss(logp, logp.clone(), ADV, MASK, aggregation=mode, sample_weight=w)
    assert loss.item() == pytest.approx(expected)
    assert metrics["pg_loss"] == pytest.approx(expected)
    assert metrics["ratio_mean"] == pytest.approx(1.0)
    assert metrics["ratio_max"] == pytest.approx(1.0)
    assert metrics["clipfrac"] == 0.0
    assert metrics["approx_kl"] == pytest.approx(0.0, abs=1e-7)


def test_per_token_advantages_match_per_sample():
    g = torch.Generator().manual_seed(0)
    logp = torch.randn(3, 4, generator=g)
    old = logp + 0.1 * torch.randn(3, 4, generator=g)
    a, _ = clipped_pg_loss(logp, old, ADV, MASK)
    b, _ = clipped_pg_loss(logp, old, ADV[:, None].expand(3, 4).clone(), MASK)
    torch.testing.assert_close(a, b)


@pytest.mark.parametrize("mode", MODES)
def test_gradient_sign_follows_advantage(mode):
    old = torch.log(torch.full((2, 3), 0.4))
    logp = _leaf(old)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    loss, _ = clipped_pg_loss(logp, old, torch.tensor([1.0, -1.0]), mask, aggregation=mode)
    loss.backward()
    g = logp.grad
    # Descent (logp -= lr * grad) raises logp where A > 0 and lowers it where A < 0.
    assert (g[0, :2] < 0).all()
    assert (g[1] > 0).all()
    assert g[0, 2] == 0  # masked token


def test_clipping_kills_the_gradient_on_the_clipped_side():
    old = torch.zeros(1, 4)
    # ratios: 1.5 (> 1.28), 0.5 (< 0.8), 1.5, 0.5
    logp = _leaf(torch.log(torch.tensor([[1.5, 0.5, 1.5, 0.5]])))
    adv = torch.tensor([[1.0, -1.0, -1.0, 1.0]])
    loss, m = clipped_pg_loss(logp, old, adv, torch.ones(1, 4), aggregation="token-mean")
    loss.backward()
    g = logp.grad[0]
    assert g[0] == 0  # A > 0 and ratio above 1 + eps_high: clipped, no push further up
    assert g[1] == 0  # A < 0 and ratio below 1 - eps_low: clipped, no push further down
    # The other side of the trust region is never clipped (min picks the unclipped, worse term).
    assert g[2] > 0 and g[3] < 0
    assert m["clipfrac"] == 0.5 and m["clipfrac_high"] == 0.25 and m["clipfrac_low"] == 0.25
    # Value: tokens 0, 1 use the clipped ratio; 2, 3 the raw one. Mean of -[1.28, -0.8, -1.5, 0.5].
    assert loss.item() == pytest.approx(-(1.28 - 0.8 - 1.5 + 0.5) / 4)


def test_clipfrac_counts_by_hand():
    # 2 samples x 4 tokens, last token of sample 0 masked, sample 1 dropped by weight.
    ratios = torch.tensor([[1.3, 1.1, 0.7, 2.0], [5.0, 5.0, 5.0, 5.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    adv = torch.tensor([[1.0, 1.0, -1.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    _, m = clipped_pg_loss(
        torch.log(ratios), torch.zeros(2, 4), adv, mask, sample_weight=torch.tensor([1.0, 0.0])
    )
    # Live tokens: 1.3 (A>0, > 1.28: high), 1.1 (in range), 0.7 (A<0, < 0.8: low) -> 2 of 3 clipped.
    assert m["clipfrac"] == pytest.approx(2 / 3)
    assert m["clipfrac_high"] == pytest.approx(1 / 3)
    assert m["clipfrac_low"] == pytest.approx(1 / 3)
    assert m["ratio_max"] == pytest.approx(1.3)  # the masked 2.0 and the dropped 5.0 are not seen
    assert m["ratio_mean"] == pytest.approx((1.3 + 1.1 + 0.7) / 3)
    # approx_kl is k3 of KL(old || new): mean of (r - 1) - log r.
    assert m["approx_kl"] == pytest.approx(sum((r - 1) - math.log(r) for r in (1.3, 1.1, 0.7)) / 3, rel=1e-5)
    assert m["adv_mean"] == pytest.approx(1 / 3)


@pytest.mark.parametrize("mode", MODES)
def test_masked_tokens_and_dropped_samples_contribute_nothing(mode):
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(3, 5, generator=g)
    base = old + 0.2 * torch.randn(3, 5, generator=g)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 1, 0, 1]])
    weight = torch.tensor([1.0, 0.0, 1.0])
    adv = torch.tensor([0.7, -1.2, -0.4])

    def run(logp, adv):
        leaf = _leaf(logp)
        loss, _ = clipped_pg_loss(leaf, old, adv, mask, aggregation=mode, sample_weight=weight)
        loss.backward()
        return loss, leaf.grad

    loss0, grad0 = run(base, adv)
    wild = base.clone()
    wild[mask == 0] = float("inf")  # padding may hold anything
    wild[1] = 50.0  # the dropped sample
    adv2 = adv.clone()
    adv2[1] = 1e6
    loss1, grad1 = run(wild, adv2)
    assert torch.isfinite(loss1)
    torch.testing.assert_close(loss1, loss0)
    torch.testing.assert_close(grad1, grad0)
    assert (grad0[mask == 0] == 0).all() and (grad0[1] == 0).all()


@pytest.mark.parametrize("mode", MODES)
def test_empty_samples_and_empty_batch_give_no_nan(mode):
    logp = _leaf(torch.zeros(2, 3))
    mask = torch.tensor([[0, 0, 0], [1, 1, 0]])
    loss, m = clipped_pg_loss(logp, torch.zeros(2, 3), torch.tensor([5.0, 1.0]), mask, aggregation=mode)
    expected = {"seq-mean-token-mean": -1.0, "token-mean": -1.0, "seq-mean-token-sum": -2.0}[mode]
    assert loss.item() == pytest.approx(expected)  # the empty sample is not counted as a sample
    logp2 = _leaf(torch.zeros(2, 3))
    loss, m = clipped_pg_loss(logp2, torch.zeros(2, 3), torch.ones(2), torch.zeros(2, 3), aggregation=mode)
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(logp2.grad, torch.zeros(2, 3))
    assert all(math.isfinite(v) for v in m.values())


def test_kl_k3_by_hand_and_coefficient():
    logp = _leaf(torch.log(torch.tensor([[0.5, 0.5]])))
    ref = torch.log(torch.tensor([[0.25, 0.5]]))
    mask = torch.ones(1, 2)
    # k3 = exp(ref - logp) - (ref - logp) - 1: token 0: 0.5 - ln 0.5 - 1 = 0.193147; token 1: 0.
    k3 = 0.5 - math.log(0.5) - 1
    loss0, m0 = clipped_pg_loss(logp, logp.detach(), torch.zeros(1), mask, ref_logp=ref)
    assert m0["kl_ref"] == pytest.approx(k3 / 2)
    assert loss0.item() == 0.0  # logged but not added with kl_coef 0
    loss1, _ = clipped_pg_loss(logp, logp.detach(), torch.zeros(1), mask, ref_logp=ref, kl_coef=0.1)
    assert loss1.item() == pytest.approx(0.1 * k3 / 2)
    loss1.backward()
    # d k3 / d logp = 1 - exp(ref - logp): token 0 -> 0.5 (pulls logp towards the reference).
    torch.testing.assert_close(logp.grad, torch.tensor([[0.1 * 0.5 / 2, 0.0]]))


def test_entropy_logged_and_bonus_subtracted():
    logp = torch.zeros(2, 2)
    ent = _leaf(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    mask = torch.tensor([[1, 1], [1, 0]])
    loss0, m = clipped_pg_loss(logp, logp, torch.zeros(2), mask, entropy=ent)
    assert m["entropy"] == pytest.approx(2.0) and loss0.item() == 0.0
    assert "kl_ref" not in m
    loss, _ = clipped_pg_loss(logp, logp, torch.zeros(2), mask, entropy=ent, entropy_coef=0.01)
    assert loss.item() == pytest.approx(-0.01 * (1.5 + 3.0) / 2)
    loss.backward()
    assert (ent.grad[mask.bool()] < 0).all()  # descent raises entropy


@pytest.mark.parametrize("mode", MODES)
def test_micro_batches_sum_to_full_batch(mode):
    g = torch.Generator().manual_seed(1)
    b, t = 7, 6
    old = -torch.rand(b, t, generator=g)
    base = old + 0.3 * torch.randn(b, t, generator=g)
    mask = torch.rand(b, t, generator=g) < 0.6
    mask[3] = False  # a sample with no tokens
    weight = torch.tensor([1.0, 1.0, 0.0, 1.0, 2.0, 1.0, 1.0])
    adv = torch.randn(b, generator=g)
    ref = -torch.rand(b, t, generator=g)
    kw = dict(aggregation=mode, kl_coef=0.05)

    full_leaf = _leaf(base)
    full, _ = clipped_pg_loss(full_leaf, old, adv, mask, sample_weight=weight, ref_logp=ref, **kw)
    full.backward()

    norm = loss_normalizer(mask, mode, weight)
    micro_leaf = _leaf(base)
    total = torch.zeros(())
    for idx in (slice(0, 2), slice(2, 5), slice(5, 7)):
        part, _ = clipped_pg_loss(
            micro_leaf[idx],
            old[idx],
            adv[idx],
            mask[idx],
            sample_weight=weight[idx],
            ref_logp=ref[idx],
            global_normalizer=norm,
            **kw,
        )
        part.backward()
        total = total + part.detach()
    torch.testing.assert_close(total, full.detach())
    torch.testing.assert_close(micro_leaf.grad, full_leaf.grad)
    # The normaliser is additive over micro-batches too.
    parts = sum(loss_normalizer(mask[i], mode, weight[i]) for i in (slice(0, 2), slice(2, 5), slice(5, 7)))
    torch.testing.assert_close(parts, norm)


def loop_reference(logp, old, adv, mask, weight, mode, eps_low=0.2, eps_high=0.28):
    """Plain Python floats, one sample and one token at a time."""
    num = den = 0.0
    for b in range(logp.shape[0]):
        w = float(weight[b])
        tokens = []
        for t in range(logp.shape[1]):
            if not mask[b, t]:
                continue
            r = math.exp(float(logp[b, t]) - float(old[b, t]))
            a = float(adv[b])
            tokens.append(-min(r * a, min(max(r, 1 - eps_low), 1 + eps_high) * a))
        if not tokens:
            continue
        if mode == "seq-mean-token-mean":
            num, den = num + w * sum(tokens) / len(tokens), den + w
        elif mode == "token-mean":
            num, den = num + w * sum(tokens), den + w * len(tokens)
        else:
            num, den = num + w * sum(tokens), den + w
    return num / den if den > 0 else 0.0


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", range(4))
def test_matches_loop_reference(mode, seed):
    g = torch.Generator().manual_seed(seed)
    b, t = 6, 9
    old = -2 * torch.rand(b, t, generator=g, dtype=torch.float64)
    logp = old + 0.4 * torch.randn(b, t, generator=g, dtype=torch.float64)
    mask = torch.rand(b, t, generator=g) < 0.7
    weight = (torch.rand(b, generator=g) < 0.8).double() * torch.randint(1, 3, (b,), generator=g)
    adv = torch.randn(b, generator=g, dtype=torch.float64)
    loss, _ = clipped_pg_loss(logp, old, adv, mask, aggregation=mode, sample_weight=weight)
    assert loss.item() == pytest.approx(
        loop_reference(logp, old, adv, mask, weight, mode), rel=1e-9, abs=1e-12
    )


def test_aggregate_hand_values_and_errors():
    values = torch.tensor([[1.0, 2.0, 3.0], [10.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert aggregate(values, mask, "seq-mean-token-mean").item() == pytest.approx((1.5 + 10) / 2)
    assert aggregate(values, mask, "token-mean").item() == pytest.approx(13 / 3)
    assert aggregate(values, mask, "seq-mean-token-sum").item() == pytest.approx(13 / 2)
    assert aggregate(values, mask, "token-mean", global_normalizer=13.0).item() == pytest.approx(1.0)
    assert loss_normalizer(mask, "token-mean").item() == 3.0
    with pytest.raises(ValueError):
        aggregate(values, mask[:, :2])
    with pytest.raises(ValueError):
        aggregate(values, mask, sample_weight=torch.tensor([1.0, -1.0]))
    with pytest.raises(ValueError):
        aggregate(values, mask, sample_weight=torch.ones(3))


def test_registry_errors():
    assert set(MODES) <= set(AGGREGATIONS)
    with pytest.raises(KeyError, match="seq-mean-token-mean"):
        get_aggregation("mean-of-everything")
    with pytest.raises(KeyError):
        clipped_pg_loss(
            torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1), torch.ones(1, 1), aggregation="bad"
        )
    with pytest.raises(ValueError, match="already registered"):
        register_aggregation("token-mean")(lambda v, m: (v.sum(-1), m.sum(-1)))
    try:
        register_aggregation("test-token-max")(lambda v, m: ((v * m).amax(-1), (m.sum(-1) > 0).to(v.dtype)))
        assert (
            aggregate(torch.tensor([[1.0, 4.0], [2.0, 0.0]]), torch.ones(2, 2), "test-token-max").item()
            == 3.0
        )
    finally:
        losses_mod.AGGREGATIONS.unregister("test-token-max")


def test_shape_errors():
    z = torch.zeros(2, 3)
    with pytest.raises(ValueError):
        clipped_pg_loss(z, torch.zeros(2, 4), torch.zeros(2), torch.ones(2, 3))
    with pytest.raises(ValueError):
        clipped_pg_loss(z, z, torch.zeros(3), torch.ones(2, 3))
    with pytest.raises(ValueError):
        clipped_pg_loss(z, z, torch.zeros(2), torch.ones(2, 3), ref_logp=torch.zeros(2, 2))
    with pytest.raises(ValueError):
        clipped_pg_loss(z, z, torch.zeros(2), torch.ones(2, 3), eps_low=1.0)


# --- found by mutation testing (benchmarks/mutation.py) ---


def _one_token(log_ratio: float, adv: float, **kw):
    logp = torch.tensor([[log_ratio]])
    return clipped_pg_loss(logp, torch.zeros(1, 1), torch.tensor([adv]), torch.ones(1, 1, dtype=torch.bool), **kw)


def test_aggregate_ignores_nan_and_inf_under_the_mask():
    values = torch.tensor([[1.0, float("nan")], [2.0, float("inf")]])
    mask = torch.tensor([[1, 0], [1, 0]])
    for mode in MODES:
        assert float(aggregate(values, mask, mode)) == 1.5


def test_aggregate_keeps_float64():
    values = torch.tensor([[1.0], [2.0]], dtype=torch.float64)
    mask = torch.ones(2, 1)
    w = torch.tensor([0.1, 0.3], dtype=torch.float64)
    out = aggregate(values, mask, "seq-mean-token-mean", w)
    assert out.dtype == torch.float64 and float(out) == (0.1 * 1.0 + 0.3 * 2.0) / (0.1 + 0.3)
    # float64 weights on float32 values: the loss stays float32
    assert aggregate(values.float(), mask, "seq-mean-token-mean", w).dtype == torch.float32
    out = aggregate(values, mask, "token-mean", global_normalizer=0.7)
    assert out.dtype == torch.float64 and float(out) == 3.0 / 0.7


def test_aggregate_denominator_below_one():
    # one sample of weight .5: the weighted mean is the sample's mean, not half of it
    assert float(aggregate(torch.tensor([[2.0, 4.0]]), torch.ones(1, 2), sample_weight=torch.tensor([0.5]))) == 3.0
    assert float(aggregate(torch.tensor([[2.0, 4.0]]), torch.ones(1, 2), global_normalizer=0.5)) == 6.0


def test_loss_normalizer_default_mode():
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 0]])
    assert float(loss_normalizer(mask)) == 2.0  # seq-mean-token-mean: samples with tokens
    assert float(loss_normalizer(mask, "token-mean")) == 3.0


def test_zero_clip_ranges_are_allowed():
    # eps_high = 0: ratio 2 with A = 1 is clipped to 1; eps_low = 0: ratio .5 with A = -1 is clipped to 1
    loss, m = _one_token(math.log(2.0), 1.0, eps_low=0.0, eps_high=0.0)
    assert float(loss) == pytest.approx(-1.0) and m["clipfrac_high"] == 1.0
    loss, m = _one_token(math.log(0.5), -1.0, eps_low=0.0, eps_high=0.0)
    assert float(loss) == pytest.approx(1.0) and m["clipfrac_low"] == 1.0


def test_small_positive_advantage_counts_as_clipped_high_only():
    _, m = _one_token(math.log(2.0), 0.5)
    assert (m["clipfrac"], m["clipfrac_low"], m["clipfrac_high"]) == (1.0, 0.0, 1.0)
    _, m = _one_token(math.log(0.5), -0.5)
    assert (m["clipfrac"], m["clipfrac_low"], m["clipfrac_high"]) == (1.0, 1.0, 0.0)


def test_log_ratio_clamped_both_ways():
    # log-ratio 25 is clamped to 20: with A = -1 the unclipped term wins, loss = e^20
    loss, m = _one_token(25.0, -1.0)
    assert float(loss) == pytest.approx(math.exp(20.0), rel=1e-6)
    assert m["ratio_max"] == pytest.approx(math.exp(20.0), rel=1e-6)
    assert m["approx_kl"] == pytest.approx(math.exp(20.0) - 1.0 - 20.0, rel=1e-6)
    # log-ratio -25 is clamped to -20: with A = 1 the unclipped term wins, loss = -e^-20
    loss, m = _one_token(-25.0, 1.0)
    assert float(loss) == pytest.approx(-math.exp(-20.0), rel=1e-4)
    assert m["approx_kl"] == pytest.approx(math.exp(-20.0) - 1.0 + 20.0, rel=1e-6)


def test_kl_log_ratio_clamped_both_ways():
    for gap, expected in [(25.0, math.exp(20.0) - 20.0 - 1.0), (-25.0, math.exp(-20.0) + 20.0 - 1.0)]:
        ref = torch.tensor([[gap]])
        _, m = clipped_pg_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.tensor([1.0]), torch.ones(1, 1),
                               ref_logp=ref)
        assert m["kl_ref"] == pytest.approx(expected, rel=1e-6)


def test_loss_dtype_follows_logp():
    loss, _ = clipped_pg_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.tensor([0.5], dtype=torch.float64),
                              torch.ones(1, 2))
    assert loss.dtype == torch.float32


def test_ratio_max_without_live_tokens():
    _, m = clipped_pg_loss(torch.ones(2, 2), torch.zeros(2, 2), torch.tensor([1.0, 1.0]), torch.ones(2, 2),
                           sample_weight=torch.tensor([0.0, 0.0]))
    assert m["ratio_max"] == 0.0


def test_error_messages():
    with pytest.raises(ValueError, match=r"^values and mask must both be \[B, T\], got \(2, 3\) and \(2, 2\)$"):
        aggregate(torch.zeros(2, 3), torch.zeros(2, 2))
    with pytest.raises(ValueError, match=r"^sample_weight must be \[B\] = \[2\], got \(3,\)$"):
        aggregate(torch.zeros(2, 3), torch.ones(2, 3), sample_weight=torch.ones(3))
    with pytest.raises(ValueError, match=r"^sample_weight must be >= 0$"):
        aggregate(torch.zeros(2, 3), torch.ones(2, 3), sample_weight=torch.tensor([1.0, -1.0]))
    x, m = torch.zeros(1, 2), torch.ones(1, 2)
    with pytest.raises(ValueError, match=r"^logp, old_logp and loss_mask must be \[B, T\] alike, got \(1, 2\), \(1, 2\), \(1, 3\)$"):
        clipped_pg_loss(x, x, torch.zeros(1), torch.ones(1, 3))
    with pytest.raises(ValueError, match=r"^need 0 <= eps_low < 1 and eps_high >= 0, got 1.0, 0.28$"):
        clipped_pg_loss(x, x, torch.zeros(1), m, eps_low=1.0)
    with pytest.raises(ValueError, match=r"^advantages must be \[B\] or \[B, T\] for logp \(1, 2\), got \(3,\)$"):
        clipped_pg_loss(x, x, torch.zeros(3), m)
    with pytest.raises(ValueError, match=r"^ref_logp must be \(1, 2\), got \(1, 3\)$"):
        clipped_pg_loss(x, x, torch.zeros(1), m, ref_logp=torch.zeros(1, 3))
    with pytest.raises(ValueError, match=r"^entropy must be \(1, 2\), got \(1, 3\)$"):
        clipped_pg_loss(x, x, torch.zeros(1), m, entropy=torch.zeros(1, 3))

