"""A run's choice of tools (``TrainConfig.tools``) reaches the warm start: the demonstrations show the
prompts the run will show, each stage's key changes with the tools its episodes show (and only then,
so every existing key stays as it was), and ``mgrpo warm-start`` / the trainer pass the config's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mgrpo_algo.cli import main as cli_main
from mgrpo_algo.core.config import WarmStartConfig, load_config
from mgrpo_algo.core.teacher_config import MistakeConfig, TeacherConfig
from mgrpo_algo.learning import teacher_stage, warmstart
from mgrpo_algo.learning.teacher_stage import _stage_key, teacher_demonstrations
from mgrpo_algo.learning.warmstart import _role_key, demonstrations
from mgrpo_algo.training import trainer
from mgrpo_env.protocol import role_tools, system_prompt

ROOT = Path(__file__).resolve().parents[1]
ORACLE = ROOT / "configs" / "oracle-warm-start"


def _prompt(scenario, role: str, names=None) -> str:
    return system_prompt(role, role_tools(scenario, role, names), getattr(scenario, "prompt_style", "full"))


def test_demonstrations_show_the_chosen_tools(small_scenario, small_world):
    default = demonstrations(small_scenario, small_world, ["stage1/train"], 3, single=False)
    chosen = demonstrations(small_scenario, small_world, ["stage1/train"], 3, single=False, tools={"main": ["delegate"]})
    assert {c[0]["content"] for c in default["main"]} == {_prompt(small_scenario, "main")}
    assert {c[0]["content"] for c in chosen["main"]} == {_prompt(small_scenario, "main", ["delegate"])}
    assert _prompt(small_scenario, "main", ["delegate"]) != _prompt(small_scenario, "main")  # the test can tell them apart
    # the oracle never calls reason, so the episodes are the same but for the main agent's system prompt
    assert [c[1:] for c in chosen["main"]] == [c[1:] for c in default["main"]]
    assert chosen["sub"] == default["sub"]
    single = demonstrations(small_scenario, small_world, ["stage1/train"], 2, single=True,
                            tools={"single": ["search", "visit"], "main": ["delegate"]})
    assert {c[0]["content"] for c in single["single"]} == {_prompt(small_scenario, "single", ["search", "visit"])}


def test_teacher_demonstrations_show_the_chosen_tools(small_scenario, small_world):
    cfg = WarmStartConfig(splits=["stage1/train"], max_tasks=2, validation_tasks=0,
                          teacher=TeacherConfig(answer_early=MistakeConfig(0.5), draws=1))
    chats, _ = teacher_demonstrations(small_scenario, small_world, cfg, single=False,
                                      tools={"main": ["delegate"], "sub": ["search", "visit"]})
    assert {c[0]["content"] for c in chats["main"]} == {_prompt(small_scenario, "main", ["delegate"])}
    assert {c[0]["content"] for c in chats["sub"]} == {_prompt(small_scenario, "sub", ["search", "visit"])}


@pytest.mark.parametrize("key_of", [
    lambda scenario, role, tools: _role_key(scenario, WarmStartConfig(), role, "/m", None, tools),
    lambda scenario, role, tools: _stage_key(scenario, WarmStartConfig(), role, ORACLE / role, None, tools),
], ids=["oracle stage", "teacher stage"])
def test_a_stage_key_holds_the_tools_its_episodes_show(small_scenario, key_of):
    for role in ("main", "sub", "single"):
        plain = key_of(small_scenario, role, None)
        assert "tools" not in plain  # keys made before tools could be chosen still match
        assert key_of(small_scenario, role, {}) == plain
    # the hierarchy's two roles share episodes: either's tools change both keys, never the single agent's
    hierarchy = {"main": ["delegate"]}
    assert key_of(small_scenario, "main", hierarchy)["tools"] == {"main": ["delegate"]}
    assert key_of(small_scenario, "sub", hierarchy)["tools"] == {"main": ["delegate"]}
    assert key_of(small_scenario, "single", hierarchy) == key_of(small_scenario, "single", None)
    single = {"single": ["search", "visit"]}
    assert key_of(small_scenario, "single", single)["tools"] == single
    assert key_of(small_scenario, "main", single) == key_of(small_scenario, "main", None)


class _Called:
    """Stands in for a warm-start stage: records its keyword arguments, returns the folders given."""

    def __init__(self, result):
        self.result, self.kwargs = result, None

    def __call__(self, *args, **kwargs):
        self.kwargs = kwargs
        return self.result


def test_cli_warm_start_passes_the_configs_tools(tmp_path, monkeypatch):
    tools = "tools={main: [delegate], sub: [search, visit]}"
    stage2 = _Called({role: ORACLE / role for role in ("main", "sub", "single")})
    monkeypatch.setattr(teacher_stage, "teacher_warm_start", stage2)
    assert cli_main(["warm-start", "--config", str(ROOT / "configs" / "demo.yaml"), "--from", str(ORACLE),
                     "--out", str(tmp_path / "out"), "--set", tools, "--set", f"models_dir={tmp_path}/m",
                     "--set", 'kernels.pin=""']) == 0  # torch is loaded in this process: the pin would be refused
    assert stage2.kwargs["tools"] == {"main": ["delegate"], "sub": ["search", "visit"]}
    shared = _Called(ORACLE / "main")
    monkeypatch.setattr(teacher_stage, "shared_teacher_warm_start", shared)
    assert cli_main(["warm-start", "--config", str(ROOT / "configs" / "demo.yaml"), "--from", str(ORACLE), "--shared",
                     "--out", str(tmp_path / "shared"), "--set", tools, "--set", f"models_dir={tmp_path}/m",
                     "--set", 'kernels.pin=""']) == 0
    assert shared.kwargs["tools"] == {"main": ["delegate"], "sub": ["search", "visit"]}


def test_trainer_warm_starts_with_the_configs_tools(small_scenario, tmp_path, monkeypatch):
    config = load_config(None, [f"models_dir={tmp_path}", "tools={main: [delegate]}", "warm_start.epochs=1",
                                "warm_start.teacher.answer_early.rate=0.5"])
    monkeypatch.setattr("mgrpo_algo.policies.models.build_role_models",
                        lambda scenario, root, sizes, **kw: {r: tmp_path / "built" / r for r in kw["roles"]})
    stage1 = _Called({r: tmp_path / "warm" / r for r in ("main", "sub")})
    stage2 = _Called({r: tmp_path / "teacher" / r for r in ("main", "sub")})
    monkeypatch.setattr(warmstart, "warm_start", stage1)
    monkeypatch.setattr(teacher_stage, "teacher_warm_start", stage2)
    paths = trainer.role_model_paths(config, small_scenario, ["main", "sub"])
    assert paths == {r: str(tmp_path / "teacher" / r) for r in ("main", "sub")}
    assert stage1.kwargs["tools"] == stage2.kwargs["tools"] == {"main": ["delegate"]}


DEMO_START = ROOT / "configs" / "demo-warm-start"


def test_a_start_warm_started_on_other_tools_is_warned_of(small_scenario, tmp_path):
    from mgrpo_algo.training.preflight import start_tool_warnings

    def warnings(*fields):
        return start_tool_warnings(load_config(None, list(fields)), small_scenario)

    models = [f"main.model={DEMO_START / 'main'}", f"sub.model={DEMO_START / 'sub'}"]
    assert warnings(*models) == []  # the committed start saw the scenario's tools, as the run shows them
    assert warnings(*models, "tools={main: [delegate, reason]}") == []  # the same set, named
    (line,) = warnings(*models, "tools={main: [delegate]}")  # the sub model's own prompt is unchanged
    assert line.startswith(f"config field 'main.model': {DEMO_START / 'main'} was warm-started showing main the tools "
                           "delegate, reason, this run shows delegate (config field 'tools')")
    # a start built with the run's tools (its key holds them) is not warned of; without them it is
    built = tmp_path / "built"
    built.mkdir()
    (built / "warm_start.json").write_text('{"key": {"role": "main", "tools": {"main": ["delegate"]}}}')
    assert warnings(f"main.model={built}", "tools={main: [delegate]}") == []
    (line,) = warnings(f"main.model={built}")
    assert "showing main the tools delegate, this run shows delegate, reason" in line
    # a start built with a tool registered then but not here is warned of, not a crash
    (built / "warm_start.json").write_text('{"key": {"role": "sub", "tools": {"sub": ["search", "calculate"]}}}')
    (line,) = warnings(f"sub.model={built}")
    assert "showing sub the tools search, calculate, this run shows search, visit, click" in line
    (built / "warm_start.json").write_text('{"key": {"tools": 5}}')  # no usable tools: the scenario's set
    assert len(warnings(f"main.model={built}", "tools={main: [delegate]}")) == 1
    for text in ("{not json", "[1, 2]", '{"key": 3}'):  # an unreadable record is not judged, nor crashes
        (built / "warm_start.json").write_text(text)
        assert warnings(f"main.model={built}", "tools={main: [delegate]}") == []


def test_compare_and_train_print_the_warning(tmp_path, monkeypatch, capsys):
    from mgrpo_algo.experiments import compare

    class Ran(Exception):
        pass

    def stop(*args, **kwargs):
        raise Ran

    monkeypatch.setattr(compare, "run_compare", stop)
    # the demo's kernel pin off: torch is loaded in this process already, where the pin is refused (test_kernels)
    unpinned = ["--set", 'kernels.pin=""']
    with pytest.raises(Ran):
        cli_main(["compare", "--config", str(ROOT / "configs" / "demo.yaml"), "--modes", "mgrpo", *unpinned,
                  "--set", "tools={main: [delegate]}", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert err.count("mgrpo: warning: config field 'main.model'") == 1 and "sub.model" not in err
    monkeypatch.setattr(trainer, "Trainer", stop)
    with pytest.raises(Ran):
        cli_main(["train", "--config", str(ROOT / "configs" / "demo.yaml"), *unpinned, "--set", "tools={main: [delegate]}",
                  "--set", f"out_dir={tmp_path / 't'}"])
    assert capsys.readouterr().err.count("mgrpo: warning: config field 'main.model'") == 1


def test_a_start_cloned_on_another_world_version_is_warned_of(small_scenario, tmp_path):
    from mgrpo_algo.training.preflight import start_tool_warnings

    version = str(small_scenario.metadata["version"])
    for seen, expected in ((version, 0), ("2" if version != "2" else "1", 1)):
        built = tmp_path / f"v{seen}"
        built.mkdir()
        (built / "warm_start.json").write_text(json.dumps({"key": {"role": "main", "scenario": {"version": seen}}}))
        lines = start_tool_warnings(load_config(None, [f"main.model={built}"]), small_scenario)
        assert len(lines) == expected
    assert lines[0] == (f"config field 'main.model': {built} was warm-started on version {seen} of wiki-hops, this run's "
                        f"is version {version} (its pages or tasks changed); mgrpo warm-start with this config builds a "
                        "start that saw them")
