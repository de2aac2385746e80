"""Nothing degrades or is lost in silence (issue 21): a missing browser, bad model paths and devices,
a used run folder, an interrupted evaluation."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from mgrpo_algo.cli import main
from mgrpo_algo.experiments.evaluate import _record_outcome, _report
from mgrpo_algo.training.preflight import PreflightError, check_browser_for, check_model
from mgrpo_algo.training.run_folder import clear_run_folder
from mgrpo_env.episode import AgentTrajectory, EpisodeRecord, ToolCall, Turn
from mgrpo_env.tool_health import backend_failure_line, backend_failures, backend_failures_in_files
from mgrpo_tools.browser_check import BrowserUnavailable, check_browser

HINT = "apt-get install -y chromium"


def _world(scenario) -> list[str]:
    return ["--set", "num_entities=300", "--set", f"data_dir={scenario.data_dir}"]


# ------------------------------------------------------------------------------ the browser


def test_eval_without_chromium_refuses_in_one_line_unless_browser_mode_never(small_scenario, tmp_path):
    env = {**os.environ, "MGRPO_CHROMIUM": str(tmp_path / "no-chromium")}
    base = [sys.executable, "-m", "mgrpo_algo.cli", "eval", "--scenario", "wiki-hops", "--agent", "oracle",
            "--limit", "2", "--quiet", *_world(small_scenario)]
    done = subprocess.run(base, capture_output=True, text=True, timeout=120, env=env)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert HINT in lines[0] and "browser_mode: never" in lines[0] and "no-chromium" in lines[0]
    done = subprocess.run([*base, "--set", "browser_mode=never"], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert "tool backend failures: none" in done.stdout


def test_a_world_with_javascript_pages_does_not_open_without_chromium(small_scenario, monkeypatch):
    monkeypatch.setenv("MGRPO_CHROMIUM", "/nonexistent/chromium")
    with pytest.raises(BrowserUnavailable, match=HINT):
        small_scenario.open()
    with pytest.raises(PreflightError, match="browser_mode: never"):
        check_browser_for(small_scenario)


def test_a_chromium_that_does_not_start_fails_the_launch_check_in_one_line(monkeypatch):
    monkeypatch.setenv("MGRPO_CHROMIUM", "/bin/false")  # exists and is executable, but is no browser
    start = time.perf_counter()
    with pytest.raises(BrowserUnavailable) as info:
        check_browser(timeout_s=20)
    assert "/bin/false" in str(info.value) and HINT in str(info.value) and "\n" not in str(info.value)
    assert time.perf_counter() - start < 20


def test_train_preflight_launches_the_browser_once(tmp_path, monkeypatch, small_scenario):
    from mgrpo_algo.core.config import load_config
    from mgrpo_algo.training.preflight import preflight

    monkeypatch.setenv("MGRPO_CHROMIUM", "/bin/false")  # present (opening a world would pass), but does not start
    config = load_config(None, [f"out_dir={tmp_path}/o", f"models_dir={tmp_path}/m",
                                f"scenario_kwargs={{num_entities: 300, data_dir: {small_scenario.data_dir}}}"])
    with pytest.raises(PreflightError, match="cannot start Chromium at /bin/false.*browser_mode: never"):
        preflight(config)
    config.scenario_kwargs["browser_mode"] = "never"
    preflight(config)  # said explicitly: no browser needed


@pytest.mark.skipif(not os.access("/usr/bin/chromium", os.X_OK), reason="no Chromium at /usr/bin/chromium")
def test_the_launch_check_passes_with_chromium():
    assert check_browser() < 30


def _record(meta: dict, ok: bool = True, error: str | None = None, seed: int = 0) -> EpisodeRecord:
    call = ToolCall("visit", {"url": "http://wiki-hops.test/wiki/X"}, ok=ok, error=error, meta=meta)
    main = AgentTrajectory(agent="main_0", role="main", turns=[Turn(action="<tool_call>", kind="tool_call", tool_call=call)])
    return EpisodeRecord(episode_id=f"e{seed}", task={"id": f"t{seed}", "question": "q", "answer": "a"}, seed=seed,
                         main=main, final_answer="a", correct=True)


def test_backend_failures_are_counted_per_kind_and_lead_the_summary(tmp_path):
    records = [_record({"browser_error": "backend: Chromium not found at /x", "via": "http"}, seed=0),
               _record({"browser_error": "timeout: slow"}, seed=1),
               _record({}, ok=False, error="backend: search server down", seed=2),
               _record({}, ok=False, error="http: 404", seed=3)]  # the agent's own mistake: not counted
    counts = {"browser backend": 1, "browser timeout": 1, "visit backend": 1}
    assert backend_failures(records) == counts
    assert backend_failures(r.to_dict() for r in records) == counts
    path = tmp_path / "episodes.jsonl"
    path.write_text("".join(json.dumps(r.to_dict()) + "\n" for r in records))
    assert backend_failures_in_files([path, tmp_path / "missing.jsonl"]) == counts
    report = _report("wiki-hops", "stage2/test", "oracle", [_record_outcome(r) for r in records], 0, 0, 0)
    assert report.tool_backend_failures == counts and report.summary()["tool_backend_failures"] == counts
    first = report.table().splitlines()[0]
    assert first.startswith("WARNING: tool backend failures: browser backend 1")
    assert backend_failure_line({}) == "tool backend failures: none"


# ------------------------------------------------------------------------------ models and devices


def _train(tmp_path, *sets: str) -> list[str]:
    return ["train", "--set", f"out_dir={tmp_path / 'out'}", "--set", f"models_dir={tmp_path / 'models'}",
            *[part for s in sets for part in ("--set", s)]]


@pytest.mark.parametrize(("override", "expected"), [
    ("main.model=/nonexistent/x", "'main.model' '/nonexistent/x' is not a folder"),
    ("sub.learner.device=cuda", "'sub.learner.device' is 'cuda' but no cuda device is available"),
])
def test_bad_model_paths_and_devices_fail_in_preflight(tmp_path, capsys, override, expected):
    import torch

    if "cuda" in override and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    start = time.perf_counter()
    # a split that does not exist is checked after the models and devices: if they were not, the run
    # stops on it (fast, and with the wrong message) instead of training for minutes
    assert main(_train(tmp_path, override, "stages=[{split: stage9/train, iterations: 1}]")) == 2
    err = capsys.readouterr().err.strip()
    assert expected in err and len(err.splitlines()) == 1, err
    assert time.perf_counter() - start < 10
    assert not (tmp_path / "models").exists() and not (tmp_path / "out").exists()


def test_a_model_folder_without_config_and_an_uncached_hub_name_offline(tmp_path, monkeypatch):
    (tmp_path / "empty").mkdir()
    with pytest.raises(PreflightError, match="has no config.json"):
        check_model(str(tmp_path / "empty"), "config field 'main.model'")
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    start = time.perf_counter()
    with pytest.raises(PreflightError, match="not in the Hugging Face cache"):
        check_model("no-such-org/no-such-model-xyz", "config field 'main.model'")
    assert time.perf_counter() - start < 2


def test_an_uncached_hub_name_without_network_fails_fast(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens: refused at once
    with pytest.raises(PreflightError, match="does not answer"):
        check_model("no-such-org/no-such-model-xyz", "config field 'main.model'", timeout_s=2)


# ------------------------------------------------------------------------------ a used run folder


def test_train_into_a_used_run_folder_is_refused_and_nothing_is_touched(tmp_path, capsys):
    out = tmp_path / "out"
    (out / "checkpoints" / "iter-3").mkdir(parents=True)
    (out / "metrics.jsonl").write_text('{"iteration": 3}\n')
    (out / "notes.txt").write_text("mine")
    assert main(_train(tmp_path, "main.model=/nonexistent/x")) == 2  # the folder is checked first
    err = capsys.readouterr().err.strip()
    assert "--resume" in err and "--overwrite" in err and "out_dir" in err and len(err.splitlines()) == 1
    assert (out / "metrics.jsonl").read_text() == '{"iteration": 3}\n' and (out / "checkpoints" / "iter-3").is_dir()
    assert main([*_train(tmp_path), "--resume", "--overwrite"]) == 2
    assert "exclude each other" in capsys.readouterr().err
    assert clear_run_folder(out) == ["metrics.jsonl", "checkpoints"]
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]  # only the run's own files go


# ------------------------------------------------------------------------------ mgrpo eval keeps what it did


def test_eval_checks_out_before_any_work(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("x")
    start = time.perf_counter()
    assert main(["eval", "--scenario", "nonexistent-scenario", "--out", str(afile / "sub")]) == 2
    err = capsys.readouterr().err
    assert "afile" in err and "--out" in err  # found before the (unknown) scenario is even built
    assert time.perf_counter() - start < 5


def test_eval_interrupted_keeps_finished_episodes_and_resume_completes(small_scenario, tmp_path, capsys, monkeypatch):
    import mgrpo_env.scripted as policies

    out = tmp_path / "ev"
    args = ["eval", "--agent", "oracle", "--limit", "6", "--quiet", "--out", str(out), *_world(small_scenario)]
    assert main(args) == 0
    full = [json.loads(line) for line in (out / "episodes.jsonl").open()]
    assert len(full) == 6
    (out / "episodes.jsonl").unlink()

    calls = {"n": 0}

    class Interrupted(policies.OraclePolicy):
        def __call__(self, requests):
            calls["n"] += 1
            if calls["n"] > 12 and (out / "episodes.jsonl").stat().st_size > 0:
                raise KeyboardInterrupt
            return super().__call__(requests)

    monkeypatch.setattr(policies, "OraclePolicy", Interrupted)
    assert main(args) == 130
    err = capsys.readouterr().err.strip().splitlines()
    kept = [json.loads(line) for line in (out / "episodes.jsonl").open()]
    assert 0 < len(kept) < 6 and err[-1].startswith(f"mgrpo: interrupted: kept {len(kept)} finished episodes")
    assert "--resume" in err[-1]
    monkeypatch.setattr(policies, "OraclePolicy", Interrupted.__mro__[1])
    assert main(args) == 2  # without --resume the kept episodes are not overwritten
    assert "--resume" in capsys.readouterr().err
    assert main([*args, "--resume"]) == 0
    resumed = [json.loads(line) for line in (out / "episodes.jsonl").open()]
    assert [r["seed"] for r in resumed] == [r["seed"] for r in full]
    assert [r["final_answer"] for r in resumed] == [r["final_answer"] for r in full]
    assert {r["episode_id"] for r in kept} <= {r["episode_id"] for r in resumed}  # kept ones were not rerun


# ------------------------------------------------------------------------------ make installs Chromium or stops


@pytest.mark.parametrize("target", ["demo", "demo-oracle", "warm-start", "test"])
def test_make_targets_that_need_chromium_stop_at_once_in_one_line(target):
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    start = time.perf_counter()
    done = subprocess.run(["make", "-s", target, "CHROMIUM=/nonexistent/chromium", "APT_GET=/nonexistent/apt-get"],
                          cwd=root, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and time.perf_counter() - start < 45  # stops at once: no install (a loaded box is slow)
    assert "pip" not in done.stdout + done.stderr  # stopped before installing anything
    # make's own error line: "make: ***", or "make[1]: ***" when the suite itself runs under make (make test)
    ours = [line for line in done.stderr.splitlines() if not re.match(r"make(\[\d+\])?: \*\*\*", line)]
    assert len(ours) == 1 and "apt-get install -y chromium" in ours[0], done.stderr


# ------------------------------------------------------------------------------ the small items


def test_oracle_agent_on_a_scenario_without_an_oracle_is_one_line(tmp_path, capsys):
    data = tmp_path / "qa.jsonl"
    data.write_text('{"question": "capital of France?", "answer": "Paris"}\n')
    for agent in ("oracle", "scenario-oracle"):
        assert main(["eval", "--scenario", "qa-file", "--data", str(data), "--agent", agent,
                     "--set", "browser_mode=never"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "oracle" in err and "--agent random" in err, err


def test_a_benchmark_without_data_names_the_flag(capsys):
    assert main(["eval", "--scenario", "gaia"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "mgrpo: scenario 'gaia' needs --data (the benchmark's released files)"


def test_view_says_when_it_replaces_a_page(tmp_path, capsys):
    records = [_record({}, seed=0)]
    (tmp_path / "episodes.jsonl").write_text(json.dumps(records[0].to_dict()) + "\n")
    assert main(["view", str(tmp_path)]) == 0
    assert "replaced" not in capsys.readouterr().out
    assert main(["view", str(tmp_path)]) == 0
    assert "it replaced the previous one" in capsys.readouterr().out


def test_python_dash_m_mgrpo_algo_is_the_cli():
    done = subprocess.run([sys.executable, "-m", "mgrpo_algo", "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "usage: mgrpo" in done.stdout
