"""Crash consistency: the MGRPO_FAULT kill points, and ``mgrpo train --resume`` after SIGKILLs.

The role-server side (kills inside act, between the store write and the checkpoint, during the
update) is in tests/test_decoupled.py; this file checks the hook itself and the in-process loop.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from mgrpo_algo.core.faults import FAULT_ENV, FaultPoints, parse_faults

ROOT = Path(__file__).resolve().parents[1]
WARM = ROOT / "configs" / "demo-warm-start"
B, K, ITERATIONS = 2, 2, 3


def test_parse_faults_and_refuse_typos():
    assert parse_faults("after_store_write:role=main:iteration=1; act:call=2") == [
        ("after_store_write", {"role": "main", "iteration": "1"}), ("act", {"call": "2"})]
    assert parse_faults(None) == parse_faults("") == []
    with pytest.raises(ValueError, match="unknown kill point 'after_store'"):
        parse_faults("after_store:iteration=1")
    with pytest.raises(ValueError, match="not key=value"):
        parse_faults("act:iteration")


def test_a_point_kills_once_per_marker_folder(tmp_path):
    """The process dies by SIGKILL at the matching hit only, and a restart goes past it."""
    script = ("import sys; from mgrpo_algo.core.faults import FaultPoints\n"
              "f = FaultPoints.from_env(sys.argv[1])\n"
              "f.hit('after_update', role='main', iteration=0)\n"  # no match: iteration 1 is named
              "f.hit('after_update', role='main', iteration=1)\n"
              "print('survived')\n")
    env = {**os.environ, FAULT_ENV: "after_update:role=main:iteration=1", "PYTHONPATH": str(ROOT)}
    first = subprocess.run([sys.executable, "-c", script, str(tmp_path)], env=env, capture_output=True, text=True)
    assert first.returncode == -signal.SIGKILL and "survived" not in first.stdout
    second = subprocess.run([sys.executable, "-c", script, str(tmp_path)], env=env, capture_output=True, text=True)
    assert second.returncode == 0 and "survived" in second.stdout
    assert FaultPoints(None, tmp_path).names == set()  # unset: hit() is one set lookup


def train_args(scenario, out: Path, models: Path) -> list[str]:
    sets = [
        "mode=mgrpo", f"out_dir={out}", f"models_dir={models}", "warm_start.epochs=0",
        f"scenario_kwargs={{num_entities: 300, data_dir: {scenario.data_dir}, profile: tiny}}",
        f"questions_per_iteration={B}", f"group_size={K}", f"stages=[{{split: stage2/train, iterations: {ITERATIONS}}}]",
        f"main.model={WARM}/main", f"sub.model={WARM}/sub", "limits={max_main_turns: 4, max_sub_turns: 3, max_delegations: 2}",
        "main.generation.max_new_tokens=64", "sub.generation.max_new_tokens=64",
    ]
    return [arg for s in sets for arg in ("--set", s)]


def mgrpo_train(args: list[str], fault: str) -> subprocess.CompletedProcess:
    env = {**os.environ, FAULT_ENV: fault, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "mgrpo_algo.cli", "train", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)


@pytest.mark.slow  # ~2 min of killed and restarted runs: CI runs the slow crash tests after make test
def test_train_resume_after_sigkills_equals_an_uninterrupted_run(small_scenario, tmp_path):
    """`mgrpo train` killed twice (after iteration 1's update before its commit, then right after
    iteration 2's update) and resumed ends with the parameters of an uninterrupted run, and
    metrics.jsonl / episodes.jsonl hold each iteration exactly once."""
    import torch
    from safetensors.torch import load_file

    from mgrpo_algo.core.config import load_config
    from mgrpo_algo.training.trainer import Trainer

    out = tmp_path / "killed"
    args = train_args(small_scenario, out, tmp_path / "models")
    fault = "loop_before_commit:iteration=1;loop_after_update:iteration=2"
    first = mgrpo_train(args, fault)
    assert first.returncode == -signal.SIGKILL, first.stderr[-3000:]
    assert json.loads((out / "loop_state.json").read_text())["iteration"] == 0  # iteration 1 was not committed
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2  # ... though its line was written
    second = mgrpo_train([*args, "--resume"], fault)
    assert second.returncode == -signal.SIGKILL, second.stderr[-3000:]
    third = mgrpo_train([*args, "--resume"], fault)
    assert third.returncode == 0, third.stderr[-3000:]
    assert "1 iterations" in third.stdout

    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["iteration"] for m in lines] == list(range(ITERATIONS))
    assert len((out / "episodes.jsonl").read_text().splitlines()) == ITERATIONS * B * K
    for role in ("main", "sub"):  # each worker keeps only its checkpoint of the last committed iteration
        assert sorted(p.name for p in (out / "workers" / role / "checkpoints").glob("iter-*")) == [f"iter-{ITERATIONS - 1}"]

    clean_args = train_args(small_scenario, tmp_path / "clean", tmp_path / "models")
    with Trainer(load_config(None, clean_args[1::2])) as clean:
        history = clean.run()
        learners = {role: worker.learner for role, worker in clean.workers.items()}
    assert [h["main/skipped"] + h["sub/skipped"] for h in history] == [0.0] * ITERATIONS  # both roles train
    for role in ("main", "sub"):
        saved = out / "workers" / role / "checkpoints" / f"iter-{ITERATIONS - 1}"
        assert json.loads((saved / "learner.json").read_text())["step"] == learners[role].step == ITERATIONS
        params = load_file(str(saved / "model" / "model.safetensors"))
        local = learners[role].model.state_dict()
        for name, tensor in params.items():
            assert torch.equal(local[name], tensor), f"{role}: {name} differs after kill and resume"
    # the metrics of the resumed iterations are those of the uninterrupted run (timings aside, and the
    # store's byte counters: per process since it started, with time stamps in them)
    def steady(metrics):
        return {k: v for k, v in metrics.items()
                if not k.startswith("time/") and not k.endswith(("/seconds", "/tokens_per_s")) and "/store_bytes_" not in k}

    for a, b in zip(history, lines, strict=True):
        assert steady(a) == steady(b)


def test_recover_puts_back_the_checkpoint_a_kill_inside_save_left_aside(tmp_path):
    """RoleLearner.save replaces a checkpoint with two renames; killed between them, only
    ``.checkpoint.old-<pid>`` exists, and a restarting role worker must find it at its place."""
    from mgrpo_algo.learning.learner import RoleLearner

    old, tmp = tmp_path / ".checkpoint.old-123", tmp_path / ".checkpoint.tmp-123"
    old.mkdir()
    (old / "learner.json").write_text('{"step": 1}')
    tmp.mkdir()
    RoleLearner.recover(tmp_path / "checkpoint")
    assert json.loads((tmp_path / "checkpoint" / "learner.json").read_text()) == {"step": 1}
    assert not old.exists() and not tmp.exists()
    RoleLearner.recover(tmp_path / "checkpoint")  # nothing to do
    assert (tmp_path / "checkpoint" / "learner.json").exists()
