"""The loop -> worker boundary is typed: RoleService lists the worker's methods with their signatures,
RoleClient forwards each one to the method of that name, and no string-named call is left outside
the placements."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from mgrpo_algo.training.roles import RoleWorker
from mgrpo_algo.training.service import RoleClient, RoleService

ROOT = Path(__file__).resolve().parents[1]
#: Public worker methods the loop never calls: the worker's own (discard) and the handle's (close).
NOT_SERVICE = {"discard", "close"}


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
    client.submit_update_main(3, ["slot"])
    client.submit_update_sub(3, ["facts"], {"k": 2}, staleness=1)
    assert handle.calls == [("submit", "update_main", (3, ["slot"]), {}),
                            ("submit", "update_sub", (3, ["facts"], {"k": 2}), {"staleness": 1})]


def test_no_string_named_call_crosses_the_worker_boundary():
    pattern = re.compile(r"\.(call|submit)\(\s*[\"']")
    offenders = [f"{path.relative_to(ROOT)}:{i}" for path in (ROOT / "mgrpo_algo").rglob("*.py")
                 if "distributed" not in path.parts
                 for i, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert offenders == []


def test_the_sub_workers_advantages_reach_every_aligned_slot_of_the_records(small_scenario, tmp_path):
    """Across the boundary and back: each (record, agent, A_S) the sub worker returns is written into
    that record, once per aligned slot (the oracle clone delegates, so there are slots)."""
    import json

    from mgrpo_algo.core.config import load_config
    from mgrpo_algo.training.trainer import Trainer

    start = ROOT / "configs" / "oracle-warm-start"
    config = load_config(None, [
        f"main.model={start / 'main'}", f"sub.model={start / 'sub'}", "align_d=2", "questions_per_iteration=2",
        "group_size=2", f"scenario_kwargs={{num_entities: 300, data_dir: {small_scenario.data_dir}, profile: tiny}}",
        "limits={max_main_turns: 4, max_sub_turns: 3, max_delegations: 2}", "stages=[{split: stage2/train, iterations: 1}]",
        f"out_dir={tmp_path / 'run'}", f"models_dir={tmp_path / 'models'}"])
    with Trainer(config) as trainer:
        trainer.run()
    records = [json.loads(line) for line in (tmp_path / "run" / "episodes.jsonl").read_text().splitlines()]
    delegating = [r for r in records if r["subs"]]
    assert delegating  # else the test checks nothing
    for r in records:
        slots = {agent: c["aligned_slots"] for agent, c in r["components"].items() if "aligned_slots" in c}
        assert sum(slots.values()) == (2 if r["subs"] else 0)  # duplicate alignment fills d = 2 slots per rollout
        assert all("advantage" in r["components"][agent] for agent in slots)
