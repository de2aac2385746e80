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
