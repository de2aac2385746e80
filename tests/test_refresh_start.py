"""``mgrpo warm-start --from DIR --refresh``: an oracle clone fine-tuned on the oracle's own demonstrations
(the teacher with every rate 0), the single agent matched to the steps main and sub took in it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from mgrpo_algo.cli import main as cli_main
from mgrpo_algo.core.config import WarmStartConfig
from mgrpo_algo.core.teacher_config import TeacherConfig
from mgrpo_algo.learning.teacher_stage import teacher_warm_start
from mgrpo_algo.policies.models import build_role_models

ROLES = ("main", "sub", "single")
SIZES = {r: {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1} for r in ROLES}
ORACLE = TeacherConfig(draws=1, role_epochs={"main": 2, "sub": 1}, lr=3e-3, warmup_steps=2)  # no mistake at all
CFG = WarmStartConfig(splits=["stage1/train"], max_tasks=4, validation_tasks=0, batch_tokens=1024, relabel=False,
                      max_seq_tokens=4096, teacher=ORACLE)


@pytest.fixture(scope="module")
def clone(small_scenario, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("refresh") / "models"
    build_role_models(small_scenario, root, SIZES, vocab_size=512, roles=list(ROLES))
    return root


def test_a_refresh_is_the_oracles_own_demonstrations_and_matches_single_to_its_steps(small_scenario, clone, tmp_path):
    with pytest.raises(ValueError, match="no mistake with a rate above 0"):
        teacher_warm_start(small_scenario, clone, tmp_path / "no", CFG, progress=False)  # the teacher stage refuses
    done = teacher_warm_start(small_scenario, clone, tmp_path / "out", CFG, progress=False, refresh=True)
    records = {role: json.loads((done[role] / "warm_start.json").read_text()) for role in ROLES}
    steps = {role: records[role]["budget"]["teacher_stage_steps"] for role in ROLES}
    assert steps["main"] > 0 and steps["sub"] > 0
    # a refresh changes no budget: the single agent gets what main and sub got in it, not their whole totals
    assert steps["single"] == steps["main"] + steps["sub"]
    # the demonstrations were the oracle's: every teacher episode made no mistake
    draws = records["main"]["teacher"]
    assert draws and all(d["answer_early"] == 0 and d["report_without_visit"] == 0 and d["episodes"] > 0
                         for d in draws.values())


def test_the_cli_refresh_needs_a_prebuilt_clone(small_scenario, tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"scenario": "wiki-hops", "models_dir": str(tmp_path / "m"), "scenario_kwargs": {
        "num_entities": 300, "seed": 0, "data_dir": str(small_scenario.data_dir)}}))
    assert cli_main(["warm-start", "--config", str(config), "--refresh", "--out", str(tmp_path / "out")]) == 2
    assert "--refresh fine-tunes a prebuilt oracle clone: give --from DIR" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
