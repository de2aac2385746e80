"""The loop -> worker boundary is typed: RoleService lists the worker's methods with their signatures,
RoleClient forwards each one to the method of that name, and no string-named call is left outside
the placements."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest

from mgrpo_algo.training.roles import RoleWorker
from mgrpo_algo.training.service import RoleClient, RoleService

ROOT = Path(__file__).resolve().parents[1]
#: Public worker methods the loop never calls: the handle's (close).
NOT_SERVICE = {"close"}


def _public(cls: type) -> set[str]:
    return {n for n, v in vars(cls).items() if callable(v) and not n.startswith("_")}


def test_the_service_is_the_workers_methods_with_their_signatures():
    service = _public(RoleService)
    assert service == _public(RoleWorker) - NOT_SERVICE
    for name in service:
        want = inspect.signature(getattr(RoleWorker, name))
        got = inspect.signature(getattr(RoleService, name))
        assert list(got.parameters) == list(want.parameters), name
        assert [p.kind for p in got.parameters.values()] == [p.kind for p in want.parameters.values()], name
        assert [p.default for p in got.parameters.values()] == [p.default for p in want.parameters.values()], name


class _Recorder:
    """A handle that records what would cross the placement."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, tuple, dict]] = []

    def call(self, method: str, *args, **kwargs):
        self.calls.append(("call", method, args, kwargs))
        return method

    def submit(self, method: str, *args, **kwargs):
        self.calls.append(("submit", method, args, kwargs))
        return method


def test_the_client_forwards_every_method_to_the_worker_method_of_its_name():
    for name in _public(RoleService):
        params = [p for p in inspect.signature(getattr(RoleService, name)).parameters.values() if p.name != "self"]
        args = tuple(f"{name}-{p.name}" for p in params if p.kind is p.POSITIONAL_OR_KEYWORD)
        kwargs = {p.name: f"{name}-{p.name}" for p in params if p.kind is p.KEYWORD_ONLY}
        handle = _Recorder()
        assert getattr(RoleClient(handle), name)(*args, **kwargs) == name
        assert handle.calls == [("call", name, args, kwargs)], name
    handle = _Recorder()
    client = RoleClient(handle)
    client.submit(RoleService.update, 3, "batch")
    assert handle.calls == [("submit", "update", (3, "batch"), {})]
    with pytest.raises(ValueError, match="not a RoleService method"):
        client.submit(RoleWorker._applied, 3)  # a worker's own helper is not on the boundary


def test_the_client_is_derived_from_the_protocol_not_written_again():
    """A method the Protocol gains is a method of the client at once, with the Protocol's signature."""
    assert _public(RoleClient) == _public(RoleService) | {"submit"}
    for name in _public(RoleService):
        assert inspect.signature(getattr(RoleClient, name)) == inspect.signature(getattr(RoleService, name)), name
    source = inspect.getsource(importlib.import_module("mgrpo_algo.training.service"))
    assert "def update(self" in source and source.count("def update(") == 1  # declared once: in the Protocol


def test_no_string_named_call_crosses_the_worker_boundary():
    pattern = re.compile(r"\.(call|submit)\(\s*[\"']")
    offenders = [f"{path.relative_to(ROOT)}:{i}" for path in (ROOT / "mgrpo_algo").rglob("*.py")
                 if "distributed" not in path.parts
                 for i, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert offenders == []


def test_records_keep_a_key_the_workers_keep_the_tokens_and_the_sub_side_its_advantages(small_scenario, tmp_path):
    """One owner per datum, through a real run: the episode records carry text, rewards and a key, no
    token ids; the key finds each agent's sampled turns in its role worker's kept trajectories
    (``keep_token_ids``); the viewer joins the A_S the sub worker kept to every aligned slot of the
    records (the oracle clone delegates, so there are slots)."""
    import json

    from mgrpo_algo.core.config import load_config
    from mgrpo_algo.experiments.view import join_sub_advantages, load_episodes
    from mgrpo_algo.training.trainer import Trainer

    start = ROOT / "configs" / "oracle-warm-start"
    config = load_config(None, [
        f"main.model={start / 'main'}", f"sub.model={start / 'sub'}", "align_d=2", "questions_per_iteration=2",
        "group_size=2", f"scenario_kwargs={{num_entities: 300, data_dir: {small_scenario.data_dir}, profile: tiny}}",
        "limits={max_main_turns: 4, max_sub_turns: 3, max_delegations: 2}", "stages=[{split: stage2/train, iterations: 1}]",
        f"out_dir={tmp_path / 'run'}", f"models_dir={tmp_path / 'models'}", "keep_token_ids=true",
        "tools={main: [delegate]}"])
    with Trainer(config) as trainer:
        trainer.run()
    run = tmp_path / "run"
    assert "prompt_ids" not in (run / "episodes.jsonl").read_text() and "completion_ids" not in (run / "episodes.jsonl").read_text()
    records, _ = load_episodes(run / "episodes.jsonl")
    assert all("reason" not in r.main.messages[0]["content"] and "delegate" in r.main.messages[0]["content"]
               for r in records)  # the run's tool choice reached its envs
    assert [r.trajectory_key for r in records] == [{"iteration": 0, "index": i} for i in range(4)]
    kept = {role: json.loads((run / "workers" / role / "trajectories" / "0.json").read_text())["turns"] for role in ("main", "sub")}
    assert not (run / "workers" / "main" / "buffers" / "0.json").exists()  # applied: moved, not copied
    for i, record in enumerate(records):
        for trajectory in [record.main, *record.subs]:
            turns = kept[trajectory.role][f"{i}/{trajectory.agent}"]
            assert len(turns) == len(trajectory.turns) and all(t["completion_ids"] for t in turns)
    assert any(r.subs for r in records)  # else the test checks nothing
    joined = join_sub_advantages(records, run)
    assert joined == 2 * sum(bool(r.subs) for r in records)  # duplicate alignment fills d = 2 slots per rollout
    for r in records:
        slots = {agent: c["aligned_slots"] for agent, c in r.components.items() if "aligned_slots" in c}
        assert sum(slots.values()) == (2 if r.subs else 0)
        assert all("advantage" in r.components[agent] for agent in slots)
