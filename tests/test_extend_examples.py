"""Each extension example (examples/extend/) runs as a user runs it: one file registers a new loss,
estimator, placement, mode or tool without editing the package, runs with it, and checks its effect."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXTEND = ROOT / "examples" / "extend"


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    """One thread; the demo's world built once in a temporary data dir for all four."""
    data = tmp_path_factory.mktemp("extend-data")
    return {**os.environ, "OMP_NUM_THREADS": "1", "MGRPO_DATA_DIR": str(data), "PYTHONUNBUFFERED": "1"}


def run(name: str, env: dict[str, str], out: Path, timeout: float = 240) -> str:
    done = subprocess.run([sys.executable, str(EXTEND / name), str(out)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, f"{name} exited {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def test_every_example_is_one_file_that_imports_the_package_only():
    files = sorted(p.name for p in EXTEND.iterdir() if p.suffix == ".py")
    assert files == ["new_estimator.py", "new_mode.py", "new_mode_shared_model.py", "new_placement.py",
                     "new_policy_loss.py", "new_reward_term.py", "new_role.py", "new_tool.py"]
    for name in files:  # registered through the public registries, nothing patched
        text = (EXTEND / name).read_text()
        assert "monkeypatch" not in text and "setattr(" not in text, name


def test_new_estimator(env, tmp_path):
    out = run("new_estimator.py", env, tmp_path)
    assert "RLOO advantages of all 8 main-agent rollouts match" in out
    assert "main_estimator=rloo" in out


def test_new_policy_loss(env, tmp_path):
    out = run("new_policy_loss.py", env, tmp_path)
    assert "main learner with policy_loss=cispo" in out and "'main/eps_max': 1.5" in out


def test_new_placement(env, tmp_path):
    out = run("new_placement.py", env, tmp_path)
    assert "role handles: {'main': 'timed', 'sub': 'timed'}" in out
    assert "mgrpo-main     update " in out and "mgrpo-sub      update " in out


def test_new_role(env, tmp_path):
    """A third role (a reader sub-agent with its own model) is called by the main agent and trained by
    M-GRPO with its own learner: its worker scored its own agents only, with group-relative A_S."""
    import json

    out = run("new_role.py", env, tmp_path, timeout=400)
    assert "called agents: ['reader', 'sub']" in out
    assert "roles whose learner stepped: ['main', 'reader', 'sub']" in out
    assert "reader advantages kept per iteration: {0: " in out and ", 1: " in out
    kept = [json.loads(p.read_text()) for p in sorted((tmp_path / "run" / "workers" / "reader" / "advantages").glob("*.json"))]
    rows = [row for rows in kept for row in rows]
    assert rows and all(row["agent"].startswith("reader_") for row in rows)  # its own agents, none of the sub's
    assert any(row["advantage"] != 0 for row in rows)  # its rewards varied within a group
    for t, iteration in enumerate(kept):  # A_S pooled per query over the reader's own slots: they sum to 0
        for query in {row["index"] // 4 for row in iteration}:
            pooled = [row["advantage"] for row in iteration if row["index"] // 4 == query]
            assert abs(sum(pooled)) < 1e-6 * max(1, len(pooled)), (t, query, pooled)
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert all("reader/reward_mean" in m and "sub/reward_mean" in m for m in metrics)  # each side under its name
    # the role brought its own start model (RoleSpec.start_model: a copy of the sub-agents' start), in its own folder
    start = tmp_path / "models" / "roles" / "reader"
    assert (start / "config.json").read_bytes() == (ROOT / "configs" / "oracle-warm-start" / "sub" / "config.json").read_bytes()


def test_new_role_without_sub_agents(env, tmp_path):
    """A mode of the main agent and a registered reader, no sub-agent: a hierarchy still (a store, the
    reader's side scored and aligned), trained in both placements with the same numbers, then evaluated."""
    import json

    done = subprocess.run([sys.executable, str(EXTEND / "new_role.py"), str(tmp_path), "--without-sub"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    assert ("called agents: ['reader']; roles whose learner stepped: ['main', 'reader']; local and processes "
            "placements: the same numbers") in done.stdout
    assert "evaluated 4 held-out episodes (2 questions x 2)" in done.stdout and "called roles ['reader']" in done.stdout
    for placement in ("local", "processes"):
        metrics = [json.loads(line) for line in (tmp_path / placement / "metrics.jsonl").open()]
        assert len(metrics) == 2 and all(m["reader/reward_mean"] >= 0 and "sub/reward_mean" not in m for m in metrics)
        assert all(m["align/d"] >= 1 for m in metrics)  # the reader's side is aligned: d > 0, not the single agent's 0


def test_new_reward_term(env, tmp_path):
    """A term registered in one file is paid by the env and recomputed alike by the sub worker (the example
    checks every pay against the formula); here, that the term moved pays and the worker kept every slot."""
    import json

    out = run("new_reward_term.py", env, tmp_path, timeout=400)
    said = next(line for line in out.splitlines() if line.startswith("env pay = R_S + 0.2 x brevity on "))
    checked, moved = (int(n) for n in re.match(r".* on (\d+) sub-agents \((\d+) paid a term\)", said).groups())
    assert checked > 0 and 0 < moved <= checked, said
    kept = sum(len(json.loads(p.read_text())) for p in (tmp_path / "run" / "workers" / "sub" / "advantages").glob("*.json"))
    assert f"the sub worker's {kept} kept slots carry the same pay" in said and kept >= checked // 2


def test_new_mode(env, tmp_path):
    out = run("new_mode.py", env, tmp_path, timeout=400)
    assert "frozen-main: roles whose learner stepped: ['sub']" in out
    assert "| frozen-main |" in out and "'after: frozen-main - mgrpo'" in out


def test_new_mode_shared_model(env, tmp_path):
    out = run("new_mode_shared_model.py", env, tmp_path, timeout=400)
    # mgrpo from its per-role start, shared-model from the one model cloned from both roles (its own start)
    assert "start models: {'hierarchy': 'demo-warm-start/sub', 'hierarchy+sub=main': 'shared-warm-start/main'}" in out
    assert "shared-model: learners ['main'] | workers ['main']" in out and "sub scored: True" in out
    assert "| shared-model |" in out


def test_new_tool(env, tmp_path):
    out = run("new_tool.py", env, tmp_path)
    assert out.count("sub_0's system prompt shows the tool: True") == 2
    assert "calculate({'expression': '(17 + 25) * 3'}) ok=True -> the sub-agent reported '126'; the main agent answered '126'" in out
