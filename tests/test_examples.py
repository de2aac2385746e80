"""Every example runs as a user would run it (a subprocess, with a timeout), so none can rot."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    """The examples' environment: one thread, worlds cached in a temporary data dir."""
    data = tmp_path_factory.mktemp("examples-data")
    return {**os.environ, "OMP_NUM_THREADS": "1", "MGRPO_DATA_DIR": str(data), "PYTHONUNBUFFERED": "1"}


def run(args: list[str], env: dict[str, str], timeout: float, cwd: Path = ROOT) -> str:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{args} exited {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def test_custom_loop(env):
    out = run([sys.executable, str(EXAMPLES / "custom_loop.py")], env, timeout=120)
    episodes = re.findall(r"correct (True|False), rewards \{'main_0': ([\d.]+)", out)
    assert len(episodes) == 3
    assert any(correct == "True" and float(reward) == 1.0 for correct, reward in episodes)  # the script can solve some
    assert "sub_0: <think>call search</think>" in out and "record as JSON" in out


def test_reinforce_from_scratch_changes_the_parameters(env):
    out = run([sys.executable, str(EXAMPLES / "reinforce_from_scratch.py")], env, timeout=240)
    changes = [float(x) for x in re.findall(r"\|theta - theta0\| ([\d.]+)", out)]
    assert len(changes) == 4 and 0 < changes[0] < changes[-1], out
    assert "import mgrpo_algo" not in (EXAMPLES / "reinforce_from_scratch.py").read_text()


def test_my_scenario_installs_and_is_found_through_its_entry_point(env, tmp_path):
    source = tmp_path / "src"
    shutil.copytree(EXAMPLES / "my_scenario", source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    target = tmp_path / "site"
    run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(target),
         str(source)], env, timeout=180)
    assert list(target.glob("*.dist-info/entry_points.txt"))
    with_pkg = {**env, "PYTHONPATH": str(target)}
    out = run([str(BIN / "mgrpo"), "eval", "--scenario", "capitals", "--agent", "scenario-oracle", "--quiet",
               "--out", str(tmp_path / "eval")], with_pkg, timeout=120)
    summary = json.loads((tmp_path / "eval" / "summary.json").read_text())
    assert summary["scenario"] == "capitals" and summary["num_tasks"] == 10 and summary["exact_match"] == 1.0, out
    out = run([str(BIN / "mgrpo"), "eval", "--scenario", "capitals", "--agent", "random", "--quiet"], with_pkg, timeout=120)
    assert "capitals test - agent: random" in out
    # without the install the name is unknown: the entry point, not a path hack, made it visible
    missing = subprocess.run([str(BIN / "mgrpo"), "eval", "--scenario", "capitals"], env=env, capture_output=True,
                             text=True, timeout=120)
    assert missing.returncode == 2 and "unknown scenario 'capitals'" in missing.stderr


def test_compare_command_in_the_readme(env, tmp_path):
    config = EXAMPLES / "compare_tiny.yaml"
    command = re.search(r"#\s+(mgrpo compare .*)", config.read_text()).group(1).split()
    assert "--out" in command
    command[command.index("--out") + 1] = str(tmp_path / "compare")
    run([str(BIN / command[0]), *command[1:], "--set", f"models_dir={tmp_path / 'models'}", "--quiet"], env,
        timeout=300)
    summary = json.loads((tmp_path / "compare" / "summary.json").read_text())
    assert summary["modes"] == ["mgrpo", "single-agent"]
    assert all(summary["results"][m]["per_seed"][0]["rollouts"] == 4 for m in summary["modes"])
    assert (tmp_path / "compare" / "report.md").is_file()
    assert command[:3] == ["mgrpo", "compare", "--config"]
    assert "mgrpo compare --config examples/compare_tiny.yaml" in (ROOT / "docs/guides/own-algorithm.md").read_text()
