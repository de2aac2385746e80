"""``mgrpo compare``: one tiny 2-seed comparison of the three modes through the CLI, then its outputs."""

from __future__ import annotations

import json
import math

import pytest
import torch

from mgrpo_algo.cli import main
from mgrpo_algo.experiments.compare import AGGREGATED, MODES, aggregate, verdict

TINY = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1}


def _settings(small_scenario, tmp_path) -> list[str]:
    sizes = ", ".join(f"{role}: {{{', '.join(f'{k}: {v}' for k, v in TINY.items())}}}" for role in ("main", "sub", "single"))
    return [
        f"models_dir={tmp_path / 'models'}",
        f"scenario_kwargs={{num_entities: 300, data_dir: {small_scenario.data_dir}}}",
        f"model_sizes={{{sizes}}}",
        "warm_start={epochs: 1, max_tasks: 4, splits: [stage1/train]}",
        "stages=[{split: stage2/train, iterations: 2}]",
        "questions_per_iteration=2",
        "group_size=2",
        "limits={max_main_turns: 2, max_sub_turns: 2, max_delegations: 1}",
        *(f"{role}.generation.max_new_tokens=12" for role in ("main", "sub", "single")),
        "eval.limit=4",
        "eval.every=1",
        "eval.curve_limit=2",
        "checkpoint=false",
    ]


@pytest.fixture(scope="module")
def compared(small_scenario, tmp_path_factory):
    """Run ``mgrpo compare`` once (2 seeds x 3 modes) and share its folder and summary."""
    tmp = tmp_path_factory.mktemp("compare")
    out = tmp / "out"
    args = ["compare", "--seeds", "2", "--out", str(out)]
    for item in _settings(small_scenario, tmp):
        args += ["--set", item]
    assert main(args) == 0
    return out, json.loads((out / "summary.json").read_text())


def test_summary_structure_and_means_over_seeds(compared):
    out, summary = compared
    assert summary["seeds"] == [0, 1] and summary["modes"] == list(MODES)
    assert summary["budget"]["rollouts"] == 2 * 2 * 2  # iterations x B x K
    for mode in MODES:
        r = summary["results"][mode]
        assert len(r["per_seed"]) == 2 and [row["seed"] for row in r["per_seed"]] == [0, 1]
        for key in AGGREGATED:
            values = [row[key] for row in r["per_seed"]]
            assert r["mean"][key] == pytest.approx(sum(values) / 2)
            assert r["min"][key] == min(values) and r["max"][key] == max(values)
            assert r["std"][key] == pytest.approx(abs(values[0] - values[1]) / 2)
        for row in r["per_seed"]:
            assert row["rollouts"] == 8 and row["iterations"] == 2
            assert 0 <= row["before"]["em"] <= 1 and 0 <= row["after"]["f1"] <= 1
            assert row["before"]["tasks"] == row["after"]["tasks"] == 4
            assert row["delta_em"] == pytest.approx(row["after"]["em"] - row["before"]["em"])
            assert row["train_seconds"] > 0 and row["eval_seconds"] > 0
            assert [p["step"] for p in row["curve"]] == [1, 2]  # eval.every=1
    # the warm start is recorded, and both groups of start models are warm-started ones
    assert set(summary["warm_start"]["hierarchy"]) == {"main", "sub"}
    assert summary["warm_start"]["single"]["single"]["counts"]["sequences"] >= 1
    assert set(summary["start_models"]["hierarchy"]) == {"main", "sub"}
    assert summary["verdict"]["order_held"] in (True, False) and "+10 point rise" in summary["verdict"]["text"]


def test_modes_share_the_budget_and_mgrpo_and_frozen_sub_share_their_start(compared):
    out, summary = compared
    results = summary["results"]
    assert {results[m]["mean"]["rollouts"] for m in MODES} == {8}
    for i in range(2):
        assert results["mgrpo"]["per_seed"][i]["before"] == results["frozen-sub"]["per_seed"][i]["before"]
        before = {m: (out / f"seed{i}" / m / "eval_before.jsonl").read_text() for m in ("mgrpo", "frozen-sub")}
        assert before["mgrpo"] == before["frozen-sub"] and before["mgrpo"]


def test_eval_episodes_are_readable_by_the_viewer(compared):
    from mgrpo_algo.experiments.view import load_episodes

    out, _ = compared
    records, total = load_episodes(out / "seed0" / "mgrpo" / "eval_after.jsonl")
    assert total == 4 and records[0].main is not None and records[0].task["id"]
    single, _ = load_episodes(out / "seed1" / "single-agent" / "eval_after.jsonl")
    assert single[0].main.agent == "single_0"
    assert main(["view", str(out / "seed0" / "mgrpo" / "eval_after.jsonl"), "--out", str(out / "view.html")]) == 0


def test_png_report_and_tensorboard(compared):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, summary = compared
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (out / "report.md").read_text()
    assert "| mode | start EM | after EM | Δ EM |" in report and "| single-agent |" in report
    assert "![" in report and "curves.png" in report and summary["verdict"]["text"] in report
    assert "mgrpo compare --config" in report and (out / "config.yaml").is_file()
    # tool backend failures are counted over every episode file and named in the report (issue 21)
    assert summary["tool_backend_failures"] == {} and "tool backend failures: none." in report
    from mgrpo_algo.experiments.compare import _markdown

    degraded = _markdown({**summary, "tool_backend_failures": {"browser backend": 3}}).splitlines()
    assert degraded[2].startswith("**WARNING: tool backend failures: browser backend 3")
    expected = {
        "mgrpo": {"main/reward_mean", "main/accuracy", "sub/reward_mean", "sub/expert_mean", "rollouts"},
        "frozen-sub": {"main/reward_mean", "sub/reward_mean"},
        "single-agent": {"single/reward_mean", "single/accuracy"},
    }
    for mode, tags in expected.items():
        acc = EventAccumulator(str(out / "tb" / "seed1" / mode))
        acc.Reload()
        scalars = set(acc.Tags()["scalars"])
        assert tags | {"eval/em", "eval/f1", "eval/curve_em"} <= scalars, scalars
        assert [e.step for e in acc.Scalars("eval/em")] == [0, 2]
        assert [e.step for e in acc.Scalars("main/reward_mean" if mode != "single-agent" else "single/reward_mean")] == [0, 1]
    # the sub learner updates in mgrpo only (its step counter is logged), frozen-sub keeps its start
    tags = {m: set(EventAccumulator(str(out / "tb" / "seed0" / m)).Reload().Tags()["scalars"]) for m in ("mgrpo", "frozen-sub")}
    assert "sub/step" in tags["mgrpo"] and "sub/step" not in tags["frozen-sub"] and "main/step" in tags["frozen-sub"]


def test_the_reproduce_config_loads_back(compared):
    from mgrpo_algo.core.config import load_config

    out, _ = compared
    config = load_config(str(out / "config.yaml"))
    assert config.eval.limit == 4 and config.eval.every == 1 and config.group_size == 2


def test_cli_bad_config_or_mode_exits_2_naming_it(tmp_path, capsys):
    out = str(tmp_path / "out")
    assert main(["compare", "--set", "eval.limit=-1", "--out", out]) == 2
    assert "eval.limit" in capsys.readouterr().err
    assert main(["compare", "--set", "eval.bogus=1", "--out", out]) == 2
    assert "eval.bogus" in capsys.readouterr().err
    assert main(["compare", "--modes", "mgrpo,nope", "--out", out]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mgrpo: bad config:") and "'nope'" in err and "modes" in err
    assert main(["compare", "--seeds", "0", "--out", out]) == 2
    assert "--seeds" in capsys.readouterr().err
    assert main(["compare", "--set", "eval.split=stage9/test", "--set", "scenario_kwargs={num_entities: 50}", "--out", out]) == 2
    assert "eval.split" in capsys.readouterr().err
    assert main(["compare", "--set", "warm_start.device=tpu9", "--out", out]) == 2
    assert "warm_start.device" in capsys.readouterr().err
    if not torch.cuda.is_available():  # a CUDA config on a CPU machine is refused before any work
        assert main(["compare", "--set", "warm_start.device=cuda", "--set", "scenario_kwargs={num_entities: 50}",
                     "--out", out]) == 2
        err = capsys.readouterr().err
        assert "warm_start.device" in err and "no CUDA device" in err
    assert not (tmp_path / "out").exists()


def test_aggregate_and_verdict_from_numbers():
    assert aggregate([0.2, 0.4]) == pytest.approx({"mean": 0.3, "std": 0.1, "min": 0.2, "max": 0.4})

    def result(after, delta, std=0.0):
        return {"mean": {"after_em": after, "delta_em": delta}, "std": {"after_em": std}}

    summary = {"seeds": [0, 1], "results": {"mgrpo": result(0.5, 0.12), "frozen-sub": result(0.4, 0.05),
                                            "single-agent": result(0.3, 0.01)}}
    v = verdict(summary)
    assert v["order_held"] is True and v["rise_held"] is True and "within one standard deviation" not in v["text"]
    summary["results"]["frozen-sub"] = result(0.55, 0.1, std=0.1)
    summary["results"]["mgrpo"] = result(0.5, 0.08)
    v = verdict(summary)
    assert v["order_held"] is False and v["rise_held"] is False and "mgrpo vs frozen-sub" in v["text"]
    assert verdict({"seeds": [0], "results": {"single-agent": result(0.1, 0.0)}})["order_held"] is None


def test_evaluate_single_scores_the_single_agent_oracle(small_scenario):
    from mgrpo_algo.experiments.evaluate import evaluate_single
    from mgrpo_env.policies import OraclePolicy

    report, records = evaluate_single(small_scenario, "stage2/test", OraclePolicy(small_scenario, "single"), limit=3, k=2,
                                      env_kwargs={"max_turns": 24}, progress=False)
    assert report.num_tasks == 6 and len(records) == 6 and report.agent == "single-agent"
    assert report.exact_match == 1.0 and report.f1 == 1.0
    assert all(r.main.agent == "single_0" for r in records) and report.tool_calls.get("search", 0) > 0


def test_checks_are_computed_from_the_numbers():
    def run(after, delta, d_k):
        return {"after_em": after, "delta_em": delta, "d_k_mean": d_k}

    def result(rows):
        return {"per_seed": rows, "mean": {"after_em": sum(r["after_em"] for r in rows) / len(rows),
                                           "delta_em": sum(r["delta_em"] for r in rows) / len(rows)},
                "std": {"after_em": 0.0}}

    summary = {"seeds": [0, 1, 2], "results": {
        "mgrpo": result([run(0.50, 0.12, 1.5), run(0.52, 0.14, 1.6), run(0.49, 0.11, 1.4)]),
        "frozen-sub": result([run(0.40, 0.02, 1.5), run(0.45, 0.07, 1.5), run(0.41, 0.03, 1.5)]),
        "single-agent": result([run(0.2, 0.0, 0.0)] * 3)}}
    checks = {c["check"].split(" ")[0]: c for c in verdict(summary)["checks"]}
    assert [c["passed"] for c in verdict(summary)["checks"]] == [True, True, True, True]
    # paired gaps 10, 7, 8 points: mean 8.33 > population std 1.25
    assert "gap +8.3 ± 1.2 points over 3 seeds (+10.0, +7.0, +8.0)" in checks["mgrpo"]["figures"]
    summary["results"]["frozen-sub"] = result([run(0.40, 0.02, 0.0), run(0.60, 0.22, 0.0), run(0.41, 0.03, 0.0)])
    summary["results"]["mgrpo"] = result([run(0.50, 0.12, 0.0), run(0.52, 0.14, 0.0), run(0.49, 0.11, 0.0)])
    passed = [c["passed"] for c in verdict(summary)["checks"]]
    assert passed == [True, True, False, False]  # means 50.3 > 47.0, but gaps +10, -8, +8: 3.3 < std 8.2; no delegation
    one_seed = {"seeds": [0], "results": {m: {**r, "per_seed": r["per_seed"][:1]} for m, r in summary["results"].items()}}
    assert verdict(one_seed)["checks"][2]["passed"] is None  # a gap's spread needs >= 2 seeds


def test_before_after_arithmetic():
    """Hand-computed figures of the report's table, verdict and checks (found by mutation testing)."""
    from mgrpo_algo.experiments.compare import _delegation_check, _gap_check, _history_means, format_table

    stats = {"mean": {"before_em": 0.1, "after_em": 0.25, "delta_em": 0.15, "before_f1": 0.2, "after_f1": 0.35,
                      "rollouts": 64, "train_seconds": 90.0, "eval_seconds": 30.0},
             "std": {"before_em": 0.0, "after_em": 0.05, "delta_em": 0.05, "before_f1": 0.01, "after_f1": 0.02}}
    assert format_table({"results": {"mgrpo": stats}}).splitlines()[2] == (
        "| mgrpo | 10.0 ± 0.0 | 25.0 ± 5.0 | +15.0 ± 5.0 | 20.0 ± 1.0 | 35.0 ± 2.0 | 64 | 2.0 |")

    history = [{"x": float(i)} for i in range(1, 9)] + [{"iteration": 9}, {"x": "n/a"}]
    assert _history_means(history, "x") == (1.5, 7.5)  # quarters of 8 values: 2 each
    assert _history_means(history[:3], "x") == (1.0, 3.0)  # fewer than 4 values: one each
    assert all(math.isnan(v) for v in _history_means(history, "y"))

    def result(after, delta, std=0.0, rows=None):
        return {"mean": {"after_em": after, "delta_em": delta}, "std": {"after_em": std},
                "per_seed": rows or [{"after_em": after, "d_k_mean": 1.0}]}

    # exactly +10 points is a rise of 10; a gap equal to the larger spread is not "within" it
    summary = {"seeds": [0], "results": {"mgrpo": result(0.5, 0.1, std=0.25), "frozen-sub": result(0.25, 0.0),
                                         "single-agent": result(0.125, 0.0)}}
    v = verdict(summary)
    assert v["rise_held"] is True and v["order_held"] is True
    assert v["text"] == ("The order mgrpo > frozen-sub > single-agent held (mgrpo 50.0 vs frozen-sub 25.0 vs "
                         "single-agent 12.5 after-training EM, mean of 1 seed). M-GRPO's held-out EM rose +10.0 "
                         "points over its warm-started start, so the +10 point rise held.")
    assert v["checks"][0]["figures"] == "+10.0 points" and v["checks"][1]["figures"] == "50.0 / 25.0 / 12.5"
    summary["results"]["frozen-sub"] = result(0.25, 0.0, std=0.25 + 1e-9)
    summary["seeds"] = [0, 1]
    assert ("mean of 2 seeds); within one standard deviation across seeds: mgrpo vs frozen-sub, frozen-sub vs "
            "single-agent.") in verdict(summary)["text"]
    assert verdict(summary, rise_points=10.5)["rise_held"] is False
    assert verdict({"seeds": [0], "results": {}})["checks"][0]["figures"] == "not run"

    def run(after, d_k=None):
        return {"after_em": after} if d_k is None else {"after_em": after, "d_k_mean": d_k}

    def gaps(mgrpo, frozen):
        return _gap_check({"results": {"mgrpo": {"per_seed": mgrpo}, "frozen-sub": {"per_seed": frozen}}})

    assert _gap_check({"results": {"mgrpo": {"per_seed": []}}})["figures"] == "a mode was not run"
    one = gaps([run(0.5)], [run(0.25)])
    assert one["passed"] is None and one["figures"] == "gap +25.0 points; needs >= 2 seeds"
    # gaps 0 and 10 points: mean 5 == population std 5, not larger
    two = gaps([run(0.5), run(0.625)], [run(0.5), run(0.525)])
    assert two["passed"] is False and two["figures"].startswith("gap +5.0 ± 5.0 points over 2 seeds (+0.0, +10.0)")

    assert _delegation_check({"single-agent": {"per_seed": [run(0.1, 3.0)]}})["passed"] is None
    check = _delegation_check({"mgrpo": {"per_seed": [run(0.1, 0.5), run(0.1)]}, "frozen-sub": {"per_seed": [run(0.1, 1.0)]}})
    assert check["passed"] is True and check["figures"] == "d_k 0.50 (mean over iterations and runs)"
    assert _delegation_check({"mgrpo": {"per_seed": [run(0.1, 0.0)]}})["passed"] is False


def test_report_wording_and_strict_boundaries():
    """The exact strings the report prints, and ties that do not count as an order or a gap."""
    from mgrpo_algo.experiments.compare import _delegation_check, _gap_check, format_table

    stats = {"mean": {k: 0.0 for k in ("before_em", "after_em", "delta_em", "before_f1", "after_f1")},
             "std": {k: 0.0 for k in ("before_em", "after_em", "delta_em", "before_f1", "after_f1")}}
    stats["mean"].update(rollouts=8, train_seconds=6000.0, eval_seconds=300.0)
    assert format_table({"results": {"single-agent": stats}}).splitlines() == [
        "| mode | start EM | after EM | Δ EM | start F1 | after F1 | rollouts | minutes |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        "| single-agent | 0.0 ± 0.0 | 0.0 ± 0.0 | +0.0 ± 0.0 | 0.0 ± 0.0 | 0.0 ± 0.0 | 8 | 105.0 |",
    ]

    def result(after, delta=0.0):
        return {"mean": {"after_em": after, "delta_em": delta}, "std": {"after_em": 0.0},
                "per_seed": [{"after_em": after, "d_k_mean": 0.0}]}

    for em in [(0.5, 0.5, 0.25), (0.5, 0.25, 0.25)]:  # a tie is not an order
        v = verdict({"seeds": [0], "results": dict(zip(MODES, map(result, em), strict=True))})
        assert v["order_held"] is False and v["rise_held"] is False
        assert "single-agent did not hold (" in v["text"] and v["text"].endswith("so the +10 point rise did not hold.")
    assert [c["check"] for c in v["checks"]] == [
        "M-GRPO's held-out EM rises >= 10 points over its start",
        "after-training EM: mgrpo > frozen-sub > single-agent",
        "mgrpo - frozen-sub after EM (paired by seed) > one standard deviation of that gap",
        "the main agent delegates during RL (mean sub-agents per rollout d_k > 0)",
    ]
    gap = "mgrpo - frozen-sub after EM (paired by seed) > one standard deviation of that gap"
    assert _gap_check({"results": {}}) == {"check": gap, "passed": None, "figures": "a mode was not run"}
    one = {"results": {m: {"per_seed": [{"after_em": 0.5}]} for m in ("mgrpo", "frozen-sub")}}
    assert _gap_check(one) == {"check": gap, "passed": None, "figures": "gap +0.0 points; needs >= 2 seeds"}
    one["results"]["mgrpo"]["per_seed"].append({"after_em": 0.5})
    with pytest.raises(ValueError):  # paired by seed: the two modes must have run the same seeds
        _gap_check(one)
    assert _delegation_check({}) == {
        "check": "the main agent delegates during RL (mean sub-agents per rollout d_k > 0)", "passed": None,
        "figures": "no hierarchy mode was run"}
