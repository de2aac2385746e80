"""The typed boundary between the iteration loop and a role worker, whatever the placement.

:class:`RoleService` is what the loop (and compare's evaluation) may ask of a role worker: each
method is a method of :class:`~mgrpo_algo.training.roles.RoleWorker` with the same signature
(``tests/test_service.py`` checks both ways). :class:`RoleClient` implements it over a placement
handle (``mgrpo_algo.distributed.placement.RoleHandle``): a call names the worker's method by the
method itself (``RoleWorker.act``), not by a string typed at the call site, so a reader, a rename and
a type checker follow every call from the loop into the worker, as verl registers worker methods
instead of dispatching on names. The handle still sends the method's name over its transport (a
pipe, a Ray actor): that is the placement's business, in one place here.

Payloads are dataclasses (:class:`~mgrpo_algo.core.scoring.MainSlot`,
:class:`~mgrpo_algo.core.scoring.SubFact`, :class:`~mgrpo_algo.core.scoring.SubScoring`, the env's
``TurnRequest``: an agent's new messages only), pickled by a process or Ray placement, passed by reference in process; results
are texts and metrics. Token ids never cross: the worker that sampled them keeps them.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol

from mgrpo_env.turn_requests import TurnRequest

from ..core.scoring import MainSlot, SubFact, SubScoring
from .roles import RoleWorker

__all__ = ["RoleClient", "RoleService"]


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

    # -- updates ---------------------------------------------------------------------------------
    def update_main(self, iteration: int, slots: list[MainSlot]) -> dict[str, float]: ...
    def update_sub(self, iteration: int, facts: list[list[SubFact]], scoring: SubScoring, *,
                   staleness: int = 0) -> dict[str, float]: ...
    def update_shared(self, iteration: int, slots: list[MainSlot], facts: list[list[SubFact]],
                      scoring: SubScoring) -> dict[str, float]: ...
    def flush(self, last_iteration: int) -> dict[str, float]: ...

    # -- the commit protocol and the run's end ---------------------------------------------------
    def rollback(self, iteration: int) -> int: ...
    def committed(self, iteration: int) -> None: ...
    def end_stage(self, stage_index: int) -> None: ...
    def export(self, dest: str) -> bool: ...
    def status(self) -> dict[str, Any]: ...


class RoleClient:
    """:class:`RoleService` over a placement handle; ``submit_*`` run an update on the handle's own
    thread (two roles update at once)."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def _call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self.handle.call(method.__name__, *args, **kwargs)

    def _submit(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Future:
        return self.handle.submit(method.__name__, *args, **kwargs)

    def begin_collect(self, iteration: int) -> None:
        return self._call(RoleWorker.begin_collect, iteration)

    def act(self, iteration: int, turns: list[TurnRequest]) -> list[str]:
        return self._call(RoleWorker.act, iteration, turns)

    def release(self, episode: int, agent: str) -> None:
        return self._call(RoleWorker.release, episode, agent)

    def commit(self, iteration: int) -> int:
        return self._call(RoleWorker.commit, iteration)

    def begin_eval(self, seed: int, temperature: float, max_new_tokens: int) -> None:
        return self._call(RoleWorker.begin_eval, seed, temperature, max_new_tokens)

    def eval_act(self, turns: list[TurnRequest]) -> list[str]:
        return self._call(RoleWorker.eval_act, turns)

    def eval_release(self, episode: int, agent: str) -> None:
        return self._call(RoleWorker.eval_release, episode, agent)

    def update_main(self, iteration: int, slots: list[MainSlot]) -> dict[str, float]:
        return self._call(RoleWorker.update_main, iteration, slots)

    def submit_update_main(self, iteration: int, slots: list[MainSlot]) -> Future:
        return self._submit(RoleWorker.update_main, iteration, slots)

    def update_sub(self, iteration: int, facts: list[list[SubFact]], scoring: SubScoring, *,
                   staleness: int = 0) -> dict[str, float]:
        return self._call(RoleWorker.update_sub, iteration, facts, scoring, staleness=staleness)

    def submit_update_sub(self, iteration: int, facts: list[list[SubFact]], scoring: SubScoring, *,
                          staleness: int = 0) -> Future:
        return self._submit(RoleWorker.update_sub, iteration, facts, scoring, staleness=staleness)

    def update_shared(self, iteration: int, slots: list[MainSlot], facts: list[list[SubFact]],
                      scoring: SubScoring) -> dict[str, float]:
        return self._call(RoleWorker.update_shared, iteration, slots, facts, scoring)

    def flush(self, last_iteration: int) -> dict[str, float]:
        return self._call(RoleWorker.flush, last_iteration)

    def rollback(self, iteration: int) -> int:
        return self._call(RoleWorker.rollback, iteration)

    def committed(self, iteration: int) -> None:
        return self._call(RoleWorker.committed, iteration)

    def end_stage(self, stage_index: int) -> None:
        return self._call(RoleWorker.end_stage, stage_index)

    def export(self, dest: str) -> bool:
        return self._call(RoleWorker.export, dest)

    def status(self) -> dict[str, Any]:
        return self._call(RoleWorker.status)
