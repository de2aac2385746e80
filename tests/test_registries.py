"""Adding a loss or an estimator is one registered function and a name: the learner and the scoring
look them up by the config's name and merge what a loss returns without a list of their own."""

from __future__ import annotations

import pytest
import torch
from test_learner import batch, model_dir  # noqa: F401  (the tiny model fixture)

import mgrpo_algo.core.advantages as adv_mod
import mgrpo_algo.core.losses as loss_mod
from mgrpo_algo.core.config import LearnerConfig
from mgrpo_algo.core.losses import clipped_pg_loss, get_policy_loss, register_policy_loss
from mgrpo_algo.core.scoring import score_main_side, score_sub
from mgrpo_algo.learning.learner import RoleLearner


@pytest.fixture
def halved_loss():
    """A new loss: half the clipped one, with a metric of its own (token mean) and a maximum."""

    @register_policy_loss("test-halved", maxima=("ratio_max", "peak"), normalised=("pg_loss",))
    def halved(logp, old_logp, advantages, loss_mask, **options):
        loss, metrics = clipped_pg_loss(logp, old_logp, advantages, loss_mask, **options)
        return 0.5 * loss, {**metrics, "halved_marker": 2.0, "peak": float(loss_mask.shape[1])}

    yield "test-halved"
    loss_mod.POLICY_LOSSES.unregister("test-halved")


def test_the_learner_uses_the_loss_named_in_its_config_and_merges_its_metrics(model_dir, halved_loss):  # noqa: F811
    config = {"lr": 1e-3, "micro_batch_tokens": 64}  # several micro-batches: the metrics are merged
    clipped = RoleLearner("main", model_dir, LearnerConfig(**config)).update(batch())
    halved = RoleLearner("main", model_dir, LearnerConfig(**config, policy_loss=halved_loss)).update(batch())
    assert halved["main/micro_batches"] > 1
    assert halved["main/halved_marker"] == pytest.approx(2.0)  # a token mean of a constant: itself
    assert halved["main/peak"] == max(len(s.input_ids) for s in batch()) - 1  # merged by max, not averaged
    assert "main/halved_marker" not in clipped
    assert halved["main/loss"] == pytest.approx(0.5 * clipped["main/loss"], rel=1e-5)  # the same first step, halved
    assert halved["main/pg_loss"] == pytest.approx(clipped["main/pg_loss"], rel=1e-5)


def test_unknown_loss_and_duplicate_names_are_refused(model_dir):  # noqa: F811
    with pytest.raises(ValueError, match=r"learner.policy_loss.*unknown policy loss 'nope'.*clipped"):
        RoleLearner("main", model_dir, LearnerConfig(policy_loss="nope"))
    with pytest.raises(ValueError, match="already registered"):
        register_policy_loss("clipped")(clipped_pg_loss)
    assert get_policy_loss("clipped").fn is clipped_pg_loss


@pytest.fixture
def reversed_estimator():
    @adv_mod.register_estimator("test-reversed")
    def reversed_grpo(rewards, mask=None, *, eps=adv_mod.EPS):
        return -adv_mod.main_advantages(rewards, mask, eps=eps) if mask is None else \
            -adv_mod.sub_advantages(rewards, mask, eps=eps)

    yield "test-reversed"
    adv_mod.ESTIMATORS.unregister("test-reversed")


def test_scoring_resolves_the_estimator_by_name(reversed_estimator):
    import numpy as np
    from test_trainer import _record

    records = [_record(1.0, [1.0, 0.0], True), _record(0.0, [0.5], False)]
    paper, _ = score_main_side(records, 2)
    flipped, _ = score_main_side(records, 2, estimator=reversed_estimator)
    assert [s.advantage for s in paper] == pytest.approx([1.0, -1.0])
    assert [s.advantage for s in flipped] == pytest.approx([-1.0, 1.0])
    _, a, _ = score_sub([[1.0, 0.0], [0.5]], 2, 2, strategy="duplicate", rng=np.random.default_rng(0))
    _, b, _ = score_sub([[1.0, 0.0], [0.5]], 2, 2, strategy="duplicate", rng=np.random.default_rng(0),
                        estimator=reversed_estimator)
    assert b == pytest.approx([-v for v in a]) and any(a)
    with pytest.raises(KeyError, match="unknown advantage estimator 'nope'"):
        score_main_side(records, 2, estimator="nope")
    assert torch.is_tensor(adv_mod.get_estimator("grpo")([[1.0, 0.0]]))
