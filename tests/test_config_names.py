"""Every config field that names roles, tools, estimators, losses (and modes, strategies, placements,
mistake kinds) refuses a misspelled name in one line that names the field and the name, as the config
loads and through ``mgrpo train --set`` (exit 2, before any model is built); role keys under ``tools``,
``model_sizes`` and ``placement.resources`` included."""

from __future__ import annotations

import pytest

from mgrpo_algo.cli import main
from mgrpo_algo.core.config import load_config

# (override, the field the message names, the misspelled name, a valid name the message offers or None)
MISSPELLED = [
    ("mode=mgrp", "mode", "mgrp", "frozen-sub"),
    ("main_estimator=grpoo", "main_estimator", "grpoo", "grpo_pooled_masked"),
    ("sub_estimator=grpo_poold", "sub_estimator", "grpo_poold", "grpo_pooled_masked"),
    ("main.learner.policy_loss=clipd", "main.learner.policy_loss", "clipd", "clipped"),
    ("sub.learner.policy_loss=clip", "sub.learner.policy_loss", "clip", "clipped"),
    ("single.learner.policy_loss=ppo", "single.learner.policy_loss", "ppo", "clipped"),
    ("main.learner.aggregation=token_mean", "main.learner.aggregation", "token_mean", "token-mean"),
    ("sub.learner.loss_options={clip_hgh: 0.3}", "sub.learner.loss_options.clip_hgh", "clip_hgh", "eps_high"),
    ("align_strategy=duplicat", "align_strategy", "duplicat", "duplicate_balanced"),
    ("placement.kind=proces", "placement.kind", "proces", "processes"),
    ("tools={mian: [delegate]}", "tools", "mian", "single"),
    ("tools={main: [delegat]}", "tools.main", "delegat", "reason"),
    ("tools={sub: [serch, visit]}", "tools.sub", "serch", "click"),
    ("tools={single: [search, vist]}", "tools.single", "vist", "visit"),
    ("model_sizes={mian: {hidden_size: 32}}", "model_sizes", "mian", "single"),
    ("placement.resources={sbu: {num_cpus: 1}}", "placement.resources", "sbu", "single"),
    ("placement.resources={main: {num_gpu: 1}}", "placement.resources.main", "num_gpu", "num_gpus"),
    ("warm_start.role_epochs={sbu: 2}", "warm_start.role_epochs", "sbu", "single"),
    ("warm_start.teacher.role_epochs={singel: 2}", "warm_start.teacher.role_epochs", "singel", "single"),
    ("warm_start.teacher.answer_early.roles={mian: 0.1}", "warm_start.teacher.<mistake>.roles", "mian", "single"),
    ("warm_start.teacher.answer_erly.rate=0.1", "warm_start.teacher.answer_erly", "answer_erly", "answer_early"),
]


@pytest.mark.parametrize(("override", "field", "name", "valid"), MISSPELLED, ids=[m[0] for m in MISSPELLED])
def test_a_misspelled_name_is_refused_in_one_line_naming_the_field(override, field, name, valid):
    with pytest.raises(ValueError) as caught:
        load_config(None, [override])
    message = str(caught.value)
    assert len(message.splitlines()) == 1, message
    assert f"'{field}'" in message and name in message and valid in message, message


@pytest.mark.parametrize("override", [m[0] for m in MISSPELLED[::4]] + ["tools={mian: [delegate]}",
                                                                        "placement.resources={sbu: {num_cpus: 1}}"])
def test_train_exits_2_with_that_one_line(override, capsys, tmp_path):
    assert main(["train", "--set", override, "--set", f"out_dir={tmp_path / 'out'}",
                 "--set", f"models_dir={tmp_path / 'models'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert not (tmp_path / "models").exists() and not (tmp_path / "out").exists()


def test_the_names_spelled_right_load():
    cfg = load_config(None, [
        "mode=frozen-sub", "main_estimator=grpo", "sub_estimator=grpo_pooled_masked", "align_strategy=mask",
        "main.learner.policy_loss=clipped", "sub.learner.aggregation=token-mean", "sub.learner.loss_options={eps_high: 0.3}",
        "tools={main: [delegate], sub: [search, visit], single: [search, visit, click]}",
        "model_sizes={main: {hidden_size: 32}, sub: {hidden_size: 32}, single: {hidden_size: 32}}",
        "placement.resources={main: {num_cpus: 1, num_gpus: 0}, sub: {num_cpus: 2}}",
        "warm_start.role_epochs={main: 2, sub: 1, single: 3}", "warm_start.teacher.answer_early.roles={single: 0.1}"])
    assert cfg.tools["single"] == ["search", "visit", "click"] and cfg.placement.resources["sub"] == {"num_cpus": 2}
    assert set(cfg.model_sizes) == {"main", "sub", "single"} and cfg.warm_start.epochs_for("single") == 3.0
