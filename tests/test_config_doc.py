"""``mgrpo config`` lists every config field with default and doc; the shipped real-model config
loads and validates (issue 21, item 7). No hub access here: the config is parsed, not run."""

from __future__ import annotations

import re
from pathlib import Path

from mgrpo_algo.cli import main
from mgrpo_algo.config_doc import config_fields, field_docs
from mgrpo_algo.core.config import LearnerConfig, load_config

QWEN = Path(__file__).resolve().parents[1] / "configs" / "qwen2.5-0.5b.yaml"


def test_mgrpo_config_prints_each_field_with_default_and_doc(capsys):
    assert main(["config"]) == 0
    shown = capsys.readouterr().out.splitlines()
    i = shown.index("main.learner.lr = 0.0001  (float)")
    assert shown[i + 1].strip().startswith("AdamW learning rate")
    assert "eval.samples = 1  (int)" in shown and "limits.max_main_turns = 8  (int)" in shown
    assert "stages[].iterations = 2  (int)" in shown and "sub.served.base_url = \"\"  (str)" in shown
    assert "(undocumented)" not in shown  # every field of the tree has its doc
    assert main(["config", "eval", "--brief"]) == 0
    brief = capsys.readouterr().out
    assert brief.startswith("eval.split = ") and "main." not in brief
    assert main(["config", "nope"]) == 2 and "no config field 'nope'" in capsys.readouterr().err


def test_field_docs_are_the_attribute_docstrings():
    assert field_docs(LearnerConfig)["lr"].startswith("AdamW learning rate, constant")
    paths = [f.path for f in config_fields()]
    assert len(paths) == len(set(paths)) and "main.learner.lora_targets" in paths and "eval.greedy" in paths


def test_the_qwen_config_loads_validates_and_explains_every_setting(capsys):
    config = load_config(str(QWEN))
    for role in ("main", "sub"):
        spec = getattr(config, role)
        assert spec.model == "Qwen/Qwen2.5-0.5B-Instruct" and spec.served.enabled
        assert spec.learner.device == "cuda" and spec.learner.autocast_dtype == "bfloat16" and spec.learner.lora_rank > 0
        assert "q_proj" in spec.learner.lora_targets
    assert config.scenario == "wiki-hops" and config.scenario_kwargs["profile"] == "full"
    for number, line in enumerate(QWEN.read_text().splitlines(), 1):
        setting = re.match(r"\s*(-\s*)?[\w{].*:\s*\S", line.split("#")[0])
        assert not setting or "#" in line, f"line {number} sets something without a comment: {line!r}"
    assert main(["config", "--config", str(QWEN), "main.learner.lora_rank"]) == 0
    assert "[this config: 32]" in capsys.readouterr().out
