"""The typed boundary between the iteration loop and a role worker, whatever the placement.

:class:`RoleService` is what the loop (and compare's evaluation) may ask of a role worker: each
method is a method of :class:`~mgrpo_algo.training.roles.RoleWorker` with the same signature
(``tests/test_service.py`` checks both ways). :class:`RoleClient` implements it over a placement
handle (``mgrpo_algo.distributed.placement.RoleHandle``) and is derived from the Protocol, not
written again: one forwarder per Protocol method, with its signature, so a method added to the
Protocol (and the worker) is a method of the client at once; ``submit`` names the method by the
Protocol's method itself (``RoleService.update``), not a string typed at the call site. The handle
sends the method's name over its transport (a pipe, a Ray actor): the placement's business.

Payloads are dataclasses (:class:`~mgrpo_algo.core.scoring.RoleBatch` of
:class:`~mgrpo_algo.core.scoring.MainSlot` s or :class:`~mgrpo_algo.core.scoring.CalledFact` s, the env's
``TurnRequest``: an agent's new messages only), pickled by a process or Ray placement, passed by reference in process; results
are texts and metrics. Token ids never cross: the worker that sampled them keeps them.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol

from mgrpo_env.turn_requests import TurnRequest

from ..core.scoring import RoleBatch

__all__ = ["RoleClient", "RoleService", "service_methods"]


class RoleService(Protocol):
    """A role worker as the loop sees it (see the module docstring)."""

    # -- collection ------------------------------------------------------------------------------
    def begin_collect(self, iteration: int) -> None: ...
    def act(self, iteration: int, turns: list[TurnRequest]) -> list[str]: ...
    def release(self, episode: int, agent: str) -> None: ...
    def commit(self, iteration: int) -> int: ...

    # -- evaluation ------------------------------------------------------------------------------
    def begin_eval(self, seed: int, temperature: float, max_new_tokens: int) -> None: ...
    def eval_act(self, turns: list[TurnRequest]) -> list[str]: ...
    def eval_release(self, episode: int, agent: str) -> None: ...

    # -- the update: one for every role ----------------------------------------------------------
    def update(self, iteration: int, batch: RoleBatch) -> dict[str, float]: ...
    def flush(self, last_iteration: int) -> dict[str, float]: ...

    # -- the commit protocol and the run's end ---------------------------------------------------
    def rollback(self, iteration: int) -> int: ...
    def committed(self, iteration: int) -> None: ...
    def end_stage(self, stage_index: int) -> None: ...
    def export(self, dest: str) -> bool: ...
    def status(self) -> dict[str, Any]: ...


def service_methods(protocol: type) -> dict[str, Callable[..., Any]]:
    """The methods a service Protocol declares, by name, in declaration order."""
    return {name: value for name, value in vars(protocol).items() if inspect.isfunction(value) and not name.startswith("_")}


def _forwarder(name: str, declared: Callable[..., Any]) -> Callable[..., Any]:
    """A client method: the call goes to the worker method ``name`` over the handle."""

    @functools.wraps(declared)  # the Protocol's signature and docs
    def forward(self: RoleClient, *args: Any, **kwargs: Any) -> Any:
        return self.handle.call(name, *args, **kwargs)

    return forward


class RoleClient(RoleService):
    """:class:`RoleService` over a placement handle; every service method is derived from the Protocol
    (below the class); ``submit`` runs one on the handle's own thread (two roles update at once)."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def submit(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Future:
        """``method`` (a :class:`RoleService` method, e.g. ``RoleService.update``) on the handle's thread."""
        if service_methods(RoleService).get(method.__name__) is not method:
            raise ValueError(f"{method!r} is not a RoleService method")
        return self.handle.submit(method.__name__, *args, **kwargs)


for _name, _declared in service_methods(RoleService).items():
    setattr(RoleClient, _name, _forwarder(_name, _declared))
