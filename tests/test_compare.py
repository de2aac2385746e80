"""``mgrpo compare``: one tiny 2-seed comparison of the three modes through the CLI, then its outputs."""

from __future__ import annotations

import json
import math
from pathlib import Path

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
    # what decided the rounding, per process: the CPU, the kernels torch reports, versions and threads
    import torch

    prov = summary["provenance"]
    assert set(prov["groups"]) == set(summary["start_models"])
    for state in (prov["controller"], *prov["groups"].values()):
        assert state["torch_capability"] == torch.backends.cpu.get_cpu_capability() and state["pin"] == ""
        assert state["torch_threads"] == 1 and state["versions"]["torch"] == torch.__version__
        assert set(state["cpu"]) == {"model", "vendor", "machine", "avx2", "avx512"}
    assert "## Machine and kernels" in (out / "report.md").read_text()
    run_config = json.loads((out / "seed0" / "mgrpo" / "config.json").read_text())
    assert run_config["kernels"] == {"pin": ""} and run_config["provenance"]["torch_threads"] == 1
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
            # eval.every=1 of 2: the start, one update (evaluated), the end (from the after evaluation)
            assert [p["step"] for p in row["curve"]] == [0, 1, 2]
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
    figures = ["headline.png", "training.png", "endings.png", "mistakes.png", "attribution.png"]
    assert all((out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for name in figures)
    report = (out / "report.md").read_text()
    assert all(f"({name})" in report for name in figures)
    assert "| mode | start mean@1 | after mean@1 | Δ [95% CI] | start greedy |" in report and "| single-agent |" in report
    assert "## Paired differences" in report and "| mgrpo: after - start |" in report
    assert "![" in report and "headline.png" in report and summary["verdict"]["text"] in report
    assert "mgrpo compare --config" in report and (out / "config.yaml").is_file()
    # tool backend failures are counted over every episode file and named in the report (issue 21)
    assert summary["tool_backend_failures"] == {} and "tool backend failures: none." in report
    from mgrpo_algo.experiments.report import markdown as _markdown

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


def test_evaluate_single_scores_the_single_agent_oracle(small_scenario):
    from mgrpo_algo.experiments.evaluate import evaluate_single
    from mgrpo_env.scripted import OraclePolicy

    report, records = evaluate_single(small_scenario, "stage2/test", OraclePolicy(small_scenario, "single"), limit=3, k=2,
                                      env_kwargs={"max_turns": 24}, progress=False)
    assert report.num_tasks == 6 and len(records) == 6 and report.agent == "single-agent"
    assert report.exact_match == 1.0 and report.f1 == 1.0
    assert all(r.main.agent == "single_0" for r in records) and report.tool_calls.get("search", 0) > 0




def _iv(diff: float, low: float, high: float, n: int = 200) -> dict[str, float]:
    return {"diff": diff, "low": low, "high": high, "questions": float(n), "confidence": 0.95}


def test_aggregate_and_verdict_from_intervals():
    assert aggregate([0.2, 0.4]) == pytest.approx({"mean": 0.3, "std": 0.1, "min": 0.2, "max": 0.4})
    # greedy EM is NaN with eval.temperature > 0 and eval.greedy false: no crash inside statistics.pstdev
    assert all(math.isnan(v) for v in aggregate([float("nan"), 0.5]).values())
    rows = {m: {"per_seed": [{"d_k_mean": 1.0}]} for m in MODES}
    summary = {"seeds": [0], "eval": {"samples": 4}, "results": rows, "intervals": {
        "mgrpo: after - start": _iv(0.12, 0.05, 0.19),
        "after: mgrpo - frozen-sub": _iv(0.04, 0.01, 0.07),
        "after: frozen-sub - single-agent": _iv(0.30, 0.25, 0.35)}}
    v = verdict(summary)
    assert v["rise_held"] is True and v["order_held"] is True
    # the four checks of the scores, then the three of the mistake rates and the two of the endings: not
    # run (no rates in this summary)
    assert [c["passed"] for c in v["checks"]] == [True, True, True, True, None, None, None, None, None]
    assert v["checks"][0]["figures"] == "+12.0 [+5.0, +19.0] points, 200 questions, 95% paired bootstrap"
    assert v["text"] == ("M-GRPO's held-out mean@4 changed by +12.0 [+5.0, +19.0] points (after - start, 95% interval) "
                         "over its start, so the +10 point rise held. The order mgrpo > frozen-sub > single-agent held "
                         "(mgrpo - frozen-sub +4.0 [+1.0, +7.0], frozen-sub - single-agent +30.0 [+25.0, +35.0] points).")
    # a big point estimate whose interval reaches 0 is not a rise; a gap whose interval reaches 0 is no order
    summary["intervals"]["mgrpo: after - start"] = _iv(0.12, -0.01, 0.25)
    summary["intervals"]["after: mgrpo - frozen-sub"] = _iv(0.04, 0.0, 0.08)
    v = verdict(summary)
    assert v["rise_held"] is False and v["order_held"] is False
    assert [c["passed"] for c in v["checks"]] == [False, False, True, True, None, None, None, None, None]
    # an interval above 0 with a point estimate under the target is not a 10-point rise (exactly 10 is)
    summary["intervals"]["mgrpo: after - start"] = _iv(0.0999, 0.02, 0.18)
    assert verdict(summary)["rise_held"] is False
    summary["intervals"]["mgrpo: after - start"] = _iv(0.10, 0.02, 0.18)
    assert verdict(summary)["rise_held"] is True
    assert verdict(summary, rise_points=10.5)["rise_held"] is False
    # modes not run: n/a, never pass or fail
    only = {"seeds": [0], "eval": {"samples": 1}, "results": {"single-agent": rows["single-agent"]},
            "intervals": {"single-agent: after - start": _iv(0.0, 0.0, 0.0)}}
    v = verdict(only)
    assert v["order_held"] is None and v["rise_held"] is None and v["text"] == ""
    assert [c["passed"] for c in v["checks"]] == [None] * 9
    assert v["checks"][0]["figures"] == "not run"


def test_compare_intervals_pool_seeds_and_pair_questions():
    """``_intervals`` pools a mode's seeds per question and pairs the questions of the two sides."""
    from mgrpo_algo.experiments.compare import _intervals

    start = {"a": [False, False], "b": [True, False]}
    scores = {
        "mgrpo": {"start": [start, start], "after": [{"a": [True, True], "b": [True, False]},
                                                       {"a": [True, False], "b": [True, True]}]},
        "frozen-sub": {"start": [start, start], "after": [start, start]},
    }
    out = _intervals(scores, seed=0)
    # mgrpo after pooled: a 3/4, b 3/4; start pooled: a 0/4, b 2/4 -> diffs 0.75, 0.25 -> mean 0.5
    assert out["mgrpo: after - start"]["diff"] == pytest.approx(0.5)
    assert out["frozen-sub: after - start"]["diff"] == pytest.approx(0.0)
    assert out["after: mgrpo - frozen-sub"]["diff"] == pytest.approx(0.5)
    assert 0.25 <= out["mgrpo: after - start"]["low"] <= out["mgrpo: after - start"]["high"] <= 0.75
    assert "after: frozen-sub - single-agent" not in out and "single-agent: after - start" not in out


def test_report_table_and_history_arithmetic():
    """Hand-computed figures of the report's table and of the first/last-quarter means."""
    from mgrpo_algo.experiments.report import _delegation_check, format_table, history_means

    keys = ("before_em", "after_em", "before_greedy", "after_greedy", "before_pass_k")
    stats = {"mean": {"before_em": 0.1, "after_em": 0.25, "before_greedy": 0.2, "after_greedy": float("nan"),
                      "before_pass_k": 0.4, "rollouts": 64, "rollouts_per_minute": 32.0,
                      "train_seconds": 90.0, "eval_seconds": 30.0},
             "std": {**dict.fromkeys(keys, 0.0), "after_em": 0.05}}
    summary = {"eval": {"samples": 4}, "results": {"mgrpo": stats},
               "intervals": {"mgrpo: after - start": _iv(0.15, 0.05, 0.25)}}
    assert format_table(summary).splitlines()[0].startswith("| mode | start mean@4 | after mean@4 | Δ [95% CI] |")
    assert format_table(summary).splitlines()[2] == (
        "| mgrpo | 10.0 ± 0.0 | 25.0 ± 5.0 | +15.0 [+5.0, +25.0] | 20.0 ± 0.0 | - | 40.0 ± 0.0 | 64 | 32 | 2.0 |")

    history = [{"x": float(i)} for i in range(1, 9)] + [{"iteration": 9}, {"x": "n/a"}]
    assert history_means(history, "x") == (1.5, 7.5)  # quarters of 8 values: 2 each
    assert history_means(history[:3], "x") == (1.0, 3.0)  # fewer than 4 values: one each
    assert all(math.isnan(v) for v in history_means(history, "y"))

    def run(d_k=None):
        return {} if d_k is None else {"d_k_mean": d_k}

    assert _delegation_check({"single-agent": {"per_seed": [run(3.0)]}})["passed"] is None
    check = _delegation_check({"mgrpo": {"per_seed": [run(0.5), run()]}, "frozen-sub": {"per_seed": [run(1.0)]}})
    assert check["passed"] is True and check["figures"] == "d_k 0.50 (mean over iterations and runs)"
    assert _delegation_check({"mgrpo": {"per_seed": [run(0.0)]}})["passed"] is False
    assert _delegation_check({}) == {
        "check": "the main agent delegates during RL (mean sub-agents per rollout d_k > 0)", "passed": None,
        "figures": "no hierarchy mode was run"}


def test_split_expressions_join_splits(small_scenario):
    """An evaluation split may join several with '+', each task once, in order."""
    from mgrpo_scenarios import split_parts, split_tasks

    test = list(small_scenario.tasks("stage2/test"))
    both = split_tasks(small_scenario, "stage2/test+stage1/test")
    assert [t.id for t in both] == [t.id for t in test] + [t.id for t in small_scenario.tasks("stage1/test")]
    assert [t.id for t in split_tasks(small_scenario, "stage2/test+stage2/test")] == [t.id for t in test]
    assert split_parts(" a + b ") == ["a", "b"]
    with pytest.raises(ValueError, match="empty part"):
        split_parts("a+")


def test_preflight_takes_split_expressions(small_scenario):
    from mgrpo_algo.core.config import load_config
    from mgrpo_algo.training.preflight import PreflightError, preflight

    world = f"scenario_kwargs={{num_entities: 300, data_dir: {small_scenario.data_dir}, browser_mode: never}}"
    preflight(load_config(None, [world, "eval.split=stage2/test+stage1/test"]), check_eval=True)
    with pytest.raises(PreflightError, match="no split 'stage9/x'"):
        preflight(load_config(None, [world, "eval.split=stage2/test+stage9/x"]), check_eval=True)


def _main_actions(path) -> list[list[str]]:
    """Per episode, the main agent's actions (what the evaluated models wrote), in order."""
    return [[t["action"] for t in json.loads(line)["main"]["turns"]] for line in path.read_text().splitlines()]


def _em(path) -> float:
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return sum(bool(d["correct"]) for d in lines) / len(lines)


def test_each_row_is_its_own_runs_seed_metrics_and_episodes(compared):
    """Every figure of a row against the files of the run it names: the run's own seed, its own
    ``align/d_k_mean`` and rollouts in metrics.jsonl, EM over its own episode files; seeds sample apart."""
    out, summary = compared
    for mode in MODES:
        for row in summary["results"][mode]["per_seed"]:
            run = out / f"seed{row['seed']}" / mode
            assert json.loads((run / "config.json").read_text())["seed"] == row["seed"]
            assert json.loads((run / "config.json").read_text())["mode"] == mode
            history = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
            assert row["rollouts"] == sum(h["rollouts"] for h in history) == 8
            d_k = [h["align/d_k_mean"] for h in history] if mode != "single-agent" else [0.0]
            assert row["d_k_mean"] == pytest.approx(sum(d_k) / len(d_k))
            assert row["before_em"] == pytest.approx(_em(run / "eval_before.jsonl"))
            assert row["after_em"] == pytest.approx(_em(run / "eval_after.jsonl"))
        # the two seeds' runs sampled different rollouts (their own seeds, not one seed twice)
        # (the records keep the sampled text; the token ids stay with the role workers)
        sampled = [[t["action"] for line in (out / f"seed{s}" / mode / "episodes.jsonl")
                    .read_text().splitlines() for t in json.loads(line)["main"]["turns"]] for s in (0, 1)]
        assert all(sampled[0]) and sampled[0] != sampled[1], mode


def test_after_training_evaluates_the_trained_models(small_scenario, tmp_path, monkeypatch):
    """A learner that makes a large deterministic change: the after-evaluation's episodes are those of the
    run's final models (evaluated here on their own), and differ from the start's; frozen-sub's after
    evaluation keeps its start sub-agent but the changed main agent."""
    from mgrpo_algo.core.config import load_config
    from mgrpo_algo.experiments.compare import evaluate_policies, evaluation_policies, run_compare
    from mgrpo_algo.learning.learner import RoleLearner

    def shake(self, sequences):  # in place, as an optimizer step: the policy shares the object
        g = torch.Generator().manual_seed(7)
        with torch.no_grad():
            for p in self.params:
                p.add_(torch.randn(p.shape, generator=g) * 0.5)
        return {}

    monkeypatch.setattr(RoleLearner, "update", shake)
    settings = [s for s in _settings(small_scenario, tmp_path) if not s.startswith(("stages=", "eval."))]
    cfg = load_config(None, [*settings, "stages=[{split: stage2/train, iterations: 1}]", "eval.limit=3",
                             "main.generation.max_new_tokens=24"])
    summary = run_compare(cfg, seeds=1, out_dir=tmp_path / "out", modes=["mgrpo", "frozen-sub"], progress=False)
    scenario = small_scenario
    for mode in ("mgrpo", "frozen-sub"):
        run = tmp_path / "out" / "seed0" / mode
        before, after = _main_actions(run / "eval_before.jsonl"), _main_actions(run / "eval_after.jsonl")
        assert before != after, mode
        finals = {role: str(run / "final" / role) for role in ("main", "sub")}
        _, records = evaluate_policies(cfg, scenario, evaluation_policies(cfg, finals, finals, 0), limit=3, seed=0,
                                       progress=False, name="final")
        assert [[t.action for t in r.main.turns] for r in records] == after, mode
        assert summary["results"][mode]["per_seed"][0]["after_em"] == pytest.approx(
            sum(r.correct for r in records) / len(records))
    # frozen-sub trained only its main agent: its final sub-agent is the start's, weight for weight
    from safetensors.torch import load_file

    start_sub = load_file(str(Path(summary["start_models"]["hierarchy"]["sub"]) / "model.safetensors"))
    for mode, same in (("frozen-sub", True), ("mgrpo", False)):
        final_sub = load_file(str(tmp_path / "out" / "seed0" / mode / "final" / "sub" / "model.safetensors"))
        assert all(torch.equal(final_sub[k], start_sub[k]) for k in start_sub) is same, mode


def _numbers(summary: dict) -> dict:
    """What a comparison measured (not how long it took): per mode and seed, before / after / curve."""
    keep = ("before", "after", "delta_interval", "curve", "sub_reward", "sub_expert", "train_accuracy", "d_k_mean",
            "rollouts")
    return {mode: [{k: row[k] for k in keep} for row in runs["per_seed"]] for mode, runs in summary["results"].items()}


@pytest.fixture(scope="module")
def compared_in_process(small_scenario, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("compare-placements")
    return tmp, _compare_once(small_scenario, tmp, "in-process")


def _compare_once(small_scenario, tmp, placement: str, *extra: str) -> dict:
    out = tmp / (placement + "".join(extra))
    # sampled, as the demo's evaluations (each start evaluation seeded by its run's seed, a greedy pass beside)
    args = ["compare", "--seeds", "1", "--out", str(out), "--modes", "mgrpo,frozen-sub,single-agent",
            "--set", f"placement={{kind: {placement}}}", "--set", "eval.temperature=1.0", "--set", "eval.samples=2",
            *extra]
    for item in _settings(small_scenario, tmp):
        args += ["--set", item]
    assert main(args) == 0
    return json.loads((out / "summary.json").read_text())


@pytest.mark.parametrize("placement", ["local", "processes"])
def test_compare_on_role_workers_gives_the_in_process_numbers(placement, small_scenario, compared_in_process):
    """Training and every evaluation (curve points, after) go through the role handles: a decoupled
    placement compares, with the numbers of the in-process run."""
    tmp, reference = compared_in_process
    summary = _compare_once(small_scenario, tmp, placement)
    assert _numbers(summary) == _numbers(reference)
    assert all(row["curve"] for row in summary["results"]["mgrpo"]["per_seed"])  # curve points were evaluated


def _measured(value):
    """``value`` without what a run's clock, folder and uuids decide (seconds, rates per minute, paths of the output
    folder; the stats store's bytes written, which count its health records' time stamps): what must not
    depend on how the runs were spread over processes. NaN as a string (NaN != NaN)."""
    clock = ("_s", "seconds", "per_minute", "out_dir", "command", "reproduce", "wall", "latency", "episode_id",
             "bytes_written")
    if isinstance(value, dict):
        return {k: _measured(v) for k, v in value.items() if not (k.endswith(clock) or k.startswith("time/"))}
    if isinstance(value, list):
        return [_measured(v) for v in value]
    return "nan" if isinstance(value, float) and math.isnan(value) else value


def _run_files(out: Path, mode: str, *, metrics: bool = True) -> dict:
    """What a mode's run wrote: its config's start models, every episode of its evaluations and training,
    and (``metrics``) every iteration's metrics."""
    run = out / "seed0" / mode
    config = json.loads((run / "config.json").read_text())
    files = {"models": {role: config[role]["model"] for role in ("main", "sub", "single")}}
    for name in ("eval_before.jsonl", "episodes.jsonl", "eval_after.jsonl", *(["metrics.jsonl"] if metrics else [])):
        files[name] = [_measured(json.loads(line)) for line in (run / name).read_text().splitlines()]
    return files


def test_compare_with_two_jobs_gives_the_same_numbers(small_scenario, compared_in_process):
    """--jobs 2 runs mgrpo here and frozen-sub then single-agent in a worker process (longest first), which
    evaluates the hierarchy's start again on its own: mode by mode, by value, the same figures (every row of
    every seed, the means over seeds, the curves, the mistake rates and their intervals), the same start
    models, and the same episodes and metrics written (the start's too), as one process."""
    tmp, reference = compared_in_process
    summary = _compare_once(small_scenario, tmp, "in-process", "--jobs", "2")
    assert _numbers(summary) == _numbers(reference)
    assert summary["mistakes"] == reference["mistakes"] and summary["intervals"] == reference["intervals"]
    assert summary["start_models"] == reference["start_models"] and summary["warm_start"] == reference["warm_start"]
    for mode in ("mgrpo", "frozen-sub", "single-agent"):
        assert _measured(summary["results"][mode]) == _measured(reference["results"][mode]), mode
        jobs, one = _run_files(tmp / "in-process--jobs2", mode), _run_files(tmp / "in-process", mode)
        assert jobs == one, mode
        start = summary["start_models"]["single" if mode == "single-agent" else "hierarchy"]
        assert {r: p for r, p in jobs["models"].items() if p} == start, mode  # each mode ran from its group's start
    assert _measured(summary["verdict"]) == _measured(reference["verdict"])
    assert set(summary["mistakes"]) == {"mgrpo", "frozen-sub", "single-agent"}
    assert summary["mistakes"]["single-agent"]["start"].get("answer_early") is None  # no main decisions


def test_report_shows_each_modes_decision_mistakes(compared):
    """The mechanism beside the score: held-out mistake rates per mode, before -> after with intervals,
    recomputed here from the episode files, and the checks built from them."""
    from mgrpo_env.episode import read_jsonl
    from mgrpo_env.mistakes import mistake_rates

    out, summary = compared
    assert set(summary["mistakes"]) == set(MODES)
    for mode in MODES:
        after = [r for seed in summary["seeds"] for r in read_jsonl(out / f"seed{seed}" / mode / "eval_after.jsonl")]
        rates = mistake_rates(after, 1)  # the tiny settings' max_delegations
        for kind in ("answer_early", "answer_early_episodes", "report_without_visit"):
            assert summary["mistakes"][mode]["after"].get(kind) == pytest.approx(rates[kind]) if rates[kind] is not None \
                else summary["mistakes"][mode]["after"].get(kind) is None
    report = (out / "report.md").read_text()
    assert "## Decision mistakes (held-out)" in report
    checks = [c["check"] for c in summary["verdict"]["checks"]]
    assert sum("falls (interval below 0)" in c for c in checks) == 2 and any("does not fall" in c for c in checks)
    history = [json.loads(line) for line in (out / "seed0" / "mgrpo" / "metrics.jsonl").read_text().splitlines()]
    assert all("mistakes/answer_early_episodes" in h for h in history)  # per iteration, for the curves


def test_pool_seeds_recomputes_the_comparisons_figures(compared):
    """benchmarks/pool_seeds.py, from the episode files alone, gives the summary's pooled intervals and
    mistake changes (the same per-question pooling and bootstrap)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("pool_seeds", Path(__file__).parents[1] / "benchmarks" / "pool_seeds.py")
    pool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pool)
    out, summary = compared
    result = pool.pooled(pool.load([out]), max_delegations=1)
    assert result["seeds"] == {mode: summary["seeds"] for mode in MODES}
    for mode in MODES:
        ours = result["modes"][mode]
        assert ours["after_minus_start"] == summary["intervals"][f"{mode}: after - start"]
        assert ours["mistakes"]["after"] == summary["mistakes"][mode]["after"]
    assert result["differences"]["after: mgrpo - frozen-sub"] == summary["intervals"]["after: mgrpo - frozen-sub"]


def test_the_held_out_curve_leaves_training_and_the_after_evaluation_bit_identical(small_scenario, tmp_path):
    """Curve points evaluated every update on every held-out question (eval.every=1, curve_limit=4) against
    none (eval.every=0): the same training episodes, the same training metrics but for the curve's own
    (heldout/...) and the clock's (the demo fingerprint's filter), and the same after-training episodes: the
    curve draws on no training RNG."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from demo_fingerprint import _kept

    runs = {}
    for name, every in (("curve", "1"), ("none", "0")):
        out = tmp_path / name
        args = ["compare", "--seeds", "1", "--out", str(out), "--modes", "mgrpo"]
        for item in [*_settings(small_scenario, tmp_path), f"eval.every={every}", "eval.curve_limit=4"]:
            args += ["--set", item]
        assert main(args) == 0
        metrics = [json.loads(line) for line in (out / "seed0" / "mgrpo" / "metrics.jsonl").read_text().splitlines()]
        runs[name] = (_run_files(out, "mgrpo", metrics=False), [{k: v for k, v in m.items() if _kept(k, v) and not k.startswith("heldout/")}
                                                  for m in metrics])
    assert len(runs["curve"][1]) == 2 and any(k.startswith("heldout/") for k in json.loads(
        (tmp_path / "curve" / "seed0" / "mgrpo" / "metrics.jsonl").read_text().splitlines()[0]))
    assert runs["curve"] == runs["none"]
