"""``mgrpo eval`` takes the config tree of train / compare and evaluates through compare's function
(issue 21, item 5): the same models and settings give the same episodes and numbers."""

from __future__ import annotations

import json

import pytest

from mgrpo_algo.cli import main
from mgrpo_algo.policies.models import build_role_models

TINY = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1}


@pytest.fixture(scope="module")
def agent_folder(small_scenario, tmp_path_factory):
    """Tiny untrained main, sub and single models (a world-trained tokenizer each), as FOLDER/<role>."""
    folder = tmp_path_factory.mktemp("agent")
    build_role_models(small_scenario, folder, {r: TINY for r in ("main", "sub", "single")}, vocab_size=512,
                      roles=["main", "sub", "single"])
    return folder


def _config(small_scenario, tmp_path, **eval_section) -> str:
    """A tiny config whose limits differ from the env's defaults (so limits that are ignored show)."""
    section = {"split": "stage2/test", "limit": 3, "samples": 2, "temperature": 1.0, "greedy": False, **eval_section}
    path = tmp_path / "tiny.yaml"
    path.write_text(json.dumps({
        "scenario": "wiki-hops",
        "scenario_kwargs": {"num_entities": 300, "data_dir": str(small_scenario.data_dir)},
        "limits": {"max_main_turns": 2, "max_sub_turns": 2, "max_delegations": 1},
        "main": {"generation": {"max_new_tokens": 10}},
        "sub": {"generation": {"max_new_tokens": 10}},
        "single": {"generation": {"max_new_tokens": 10}},
        "stages": [{"split": "stage2/train", "iterations": 0}],
        "eval": section,
        "checkpoint": False,
        "seed": 3,
    }))  # JSON is YAML
    return str(path)


def _episodes(path) -> list[dict]:
    return [json.loads(line) for line in path.open() if line.strip()]


def _actions(record: dict) -> list[list[str]]:
    return [[t["action"] for t in traj["turns"]] for traj in [record["main"], *record["subs"]]]


def test_eval_gives_the_numbers_of_compares_start_evaluation(small_scenario, agent_folder, tmp_path, capsys):
    config = _config(small_scenario, tmp_path)
    pins = [f"{role}.model={agent_folder / role}" for role in ("main", "sub")]
    args = ["compare", "--config", config, "--seeds", "1", "--modes", "frozen-sub", "--out", str(tmp_path / "cmp"),
            "--quiet"]
    assert main([*args, *[p for pin in pins for p in ("--set", pin)]]) == 0
    compared = json.loads((tmp_path / "cmp" / "summary.json").read_text())["results"]["frozen-sub"]["per_seed"][0]
    start = _episodes(tmp_path / "cmp" / "seed3" / "frozen-sub" / "eval_before.jsonl")
    capsys.readouterr()

    out = tmp_path / "ev"
    assert main(["eval", "--config", config, "--agent", str(agent_folder), "--out", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    evaluated = _episodes(out / "episodes.jsonl")

    assert summary["exact_match"] == compared["before_em"] and summary["f1"] == compared["before"]["f1"]
    assert [(r["task"]["id"], r["seed"], r["correct"]) for r in evaluated] == \
        [(r["task"]["id"], r["seed"], r["correct"]) for r in start]  # the same per-question correctness
    assert [_actions(r) for r in evaluated] == [_actions(r) for r in start]  # the very same sampled episodes
    assert all(len(r["main"]["turns"]) <= 2 for r in evaluated)  # the config's limits, not the env's defaults
    assert summary["num_tasks"] == 6 and summary["pass_at_k"] == compared["before_pass_k"]
    assert "mean@2 " in printed and "pass@2 " in printed and "(3 questions x 2 samples)" in printed


def test_flags_are_shorthands_for_config_fields_and_set_reaches_limits(small_scenario, agent_folder, tmp_path):
    config = _config(small_scenario, tmp_path, samples=1, temperature=0.0)
    out = tmp_path / "ev"
    agent = f"main={agent_folder / 'main'},sub={agent_folder / 'sub'}"
    assert main(["eval", "--config", config, "--agent", agent, "--limit", "2", "--k", "1", "--workers", "1",
                 "--set", "limits.max_main_turns=1", "--out", str(out), "--quiet"]) == 0
    records = _episodes(out / "episodes.jsonl")
    assert len(records) == 2 and all(len(r["main"]["turns"]) == 1 for r in records)


def test_single_agent_forms(small_scenario, agent_folder, tmp_path, capsys):
    config = _config(small_scenario, tmp_path, samples=1, temperature=0.0, limit=1)
    assert main(["eval", "--config", config, "--agent", f"single={agent_folder / 'single'}", "--quiet"]) == 0
    assert "agent: single=" in capsys.readouterr().out
    assert main(["eval", "--config", config, "--set", "mode=single-agent", "--agent", str(agent_folder), "--quiet"]) == 0
    assert main(["eval", "--config", config, "--agent", f"main={agent_folder / 'main'}"]) == 2
    assert "give main and sub" in capsys.readouterr().err


def test_bad_settings_are_one_line(small_scenario, tmp_path, capsys):
    config = _config(small_scenario, tmp_path)
    for argv, expected in [
        (["--set", "eval.samples=0"], "config field 'eval.samples'"),
        (["--set", "limits.max_main_turnz=3"], "unknown config field 'limits.max_main_turnz'"),
        (["--set", "seed=1"], "--set scenario_kwargs.seed=N"),
        (["--agent", "main=/nonexistent/m,sub=/nonexistent/s"], "is not a folder"),
        (["--set", "main.learner.device=cuda:7", "--agent", "oracle"], None),  # scripted agents load no model
    ]:
        code = main(["eval", "--config", config, "--limit", "1", "--quiet", *argv])
        err = capsys.readouterr().err.strip()
        if expected is None:
            assert code == 0, err
        else:
            assert code == 2 and len(err.splitlines()) == 1 and expected in err, err


def test_help_documents_the_agent_forms(capsys):
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    shown = capsys.readouterr().out
    for form in ("oracle", "scenario-oracle", "random", "FOLDER", "main=PATH,sub=PATH", "single=PATH", "--config"):
        assert form in shown
