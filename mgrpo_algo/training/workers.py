"""The roles of a run, one :class:`~mgrpo_algo.training.roles.RoleWorker` each, wherever they run.

:class:`RoleWorkers` is what the iteration loop (:class:`mgrpo_algo.training.trainer.Trainer`) runs on,
for every placement: ``in-process`` and ``local`` put the workers in this process (a local handle:
arguments by reference, the records keep their token ids), ``processes`` one process per role,
``ray`` Ray actors. The loop drives the environments and asks the workers for actions; each worker
keeps the token trajectories it generated. After a batch the loop scores the main side and sends
the main worker its slots; it publishes per rollout (query, rollout, correct, format, R_M) to the
store and updates. The sub worker gets only what it knows of its own trajectories (format flag,
expert score) and the alignment width; it waits in the store for the main statistics
(synchronized) or lags behind them (stale), computes R_S and A_S itself, then updates.

Faults: a worker that dies (SIGKILL, crash) is restarted from its checkpoint; during collection the
iteration is re-collected (every worker reseeded for it: the same tokens are drawn), during an update
the update is re-sent; the worker's own state (committed buffers, ``last_applied`` carried by its
checkpoint) guarantees that nothing is lost or applied twice (tested with kills at every
``MGRPO_FAULT`` point, :mod:`mgrpo_algo.core.faults`).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mgrpo_env.episode import EpisodeRecord
from mgrpo_env.rollout import PolicyRequest

from ..core.config import MODE_TABLE, PLACEMENT_HANDLES, TrainConfig
from ..core.scoring import MainSlot, slot_payload, sub_facts
from ..distributed.placement import RoleServerDied, spawn
from .roles import RoleWorker

__all__ = ["RoleWorkers", "WorkerPolicy"]



class WorkerPolicy:
    """The loop's view of a role worker as a policy: requests out, actions back (``act`` while
    training, ``eval_act`` for an evaluation)."""

    def __init__(self, handle: Any, iteration: int | None = None) -> None:
        self.handle, self.iteration = handle, iteration

    def __call__(self, requests: Sequence[PolicyRequest]) -> list[Any]:
        light = [PolicyRequest(r.episode, r.agent, r.role, r.observation, r.messages, r.task) for r in requests]
        if self.iteration is None:
            return self.handle.call("eval_act", light)
        return self.handle.call("act", self.iteration, light)

    def release(self, episode: int, agent: str) -> None:
        self.handle.call("release" if self.iteration is not None else "eval_release", episode, agent)


class RoleWorkers:
    """The mode's roles (:data:`~mgrpo_algo.core.config.MODE_TABLE`) on workers placed by ``config.placement``."""

    def __init__(self, config: TrainConfig, paths: dict[str, str], out: Path, *, store: str, committed: int) -> None:
        placement = config.placement
        mode = MODE_TABLE[config.mode]
        self.config, self.out = config, out
        self.staleness = placement.staleness
        self.kind = PLACEMENT_HANDLES[placement.kind]
        if committed < 0:  # a fresh run: no worker state of an earlier one may leak in
            shutil.rmtree(out / "workers", ignore_errors=True)
        self.handles: dict[str, Any] = {}
        for role in mode.roles:
            kwargs = {
                "role": role, "model": paths[role], "run_dir": str(out), "store": store if not mode.single else "",
                "spec": getattr(config, role), "seed": config.seed, "torch_threads": config.torch_threads,
                "train": role in mode.trained, "return_extras": self.kind == "local",
            }
            res = placement.resources.get(role, {})
            self.handles[role] = spawn(RoleWorker, kwargs, placement=self.kind, name=f"mgrpo-{role}",
                                       num_cpus=res.get("num_cpus", 1), num_gpus=res.get("num_gpus", 0))
        if committed >= 0:  # a resumed run: every worker back to the loop's last committed iteration
            for handle in self.handles.values():
                handle.call("rollback", committed)
        self.start_iteration = committed + 1
        self.restarts: list[dict[str, Any]] = []
        self._iteration = self.start_iteration

    @property
    def workers(self) -> dict[str, RoleWorker]:
        """The worker objects, in this process only (``in-process`` and ``local``; empty otherwise)."""
        return {role: h._obj for role, h in self.handles.items() if getattr(h, "_obj", None) is not None}

    # -- fault handling -------------------------------------------------------------------------

    def _restart(self, role: str, during: str, error: BaseException) -> None:
        t0 = time.perf_counter()
        self.handles[role].restart()
        status = self.handles[role].call("status")
        self.restarts.append({"role": role, "during": during, "iteration": self._iteration, "error": repr(error),
                              "recovery_s": time.perf_counter() - t0, "status": status})

    def _call(self, role: str, method: str, *args: Any, **kwargs: Any) -> Any:
        for _ in range(3):
            try:
                return self.handles[role].call(method, *args, **kwargs)
            except RoleServerDied as exc:
                self._restart(role, method, exc)
        raise RuntimeError(f"the {role} worker kept dying during {method}")

    def _role_of(self, exc: RoleServerDied) -> str:
        return next(role for role, h in self.handles.items() if h.name == exc.name)

    # -- what the loop calls --------------------------------------------------------------------

    def collect(self, iteration: int, run: Callable[[dict[str, Any]], list[EpisodeRecord]]) -> list[EpisodeRecord]:
        self._iteration = iteration
        for _ in range(3):
            try:
                for role in self.handles:  # reseeded and emptied: a re-collection draws what the first did
                    self._call(role, "begin_collect", iteration)
                records = run({role: WorkerPolicy(h, iteration) for role, h in self.handles.items()})
                for handle in self.handles.values():
                    handle.call("commit", iteration)
                return records
            except RoleServerDied as exc:
                self._restart(self._role_of(exc), "collect", exc)  # then collected again from scratch
        raise RuntimeError(f"collection of iteration {iteration} kept failing")

    def update(self, iteration: int, main: list[MainSlot], records: list[EpisodeRecord], d: int
               ) -> tuple[dict[str, float], dict[int, list[tuple[int, str, float]]]]:
        """Each worker's update of ``iteration``: (metrics, the sub worker's A_S by applied iteration)."""
        cfg = self.config
        main_role = next(iter(self.handles))  # "main" or "single"
        calls: dict[str, tuple[str, tuple, dict]] = {main_role: ("update_main", (iteration, slot_payload(main)), {})}
        if "sub" in self.handles:
            scoring = {"k": cfg.group_size, "d": d, "strategy": cfg.align_strategy, "step_weight": cfg.step_advantage_weight,
                       "sub_weights": list(cfg.sub_weights), "estimator": cfg.sub_estimator,
                       "sub_format_gate": cfg.sub_format_gate}
            calls["sub"] = ("update_sub", (iteration, sub_facts(records), scoring), {"staleness": self.staleness})
        results: dict[str, dict[str, Any]] = {}
        if self.staleness == 0:
            # synchronized: both at once; the sub worker waits in the store for this iteration's statistics
            futures = {role: self.handles[role].submit(method, *args, **kw) for role, (method, args, kw) in calls.items()}
            for role, future in futures.items():
                try:
                    results[role] = future.result()
                except RoleServerDied as exc:
                    self._restart(role, "update", exc)
                    method, args, kw = calls[role]
                    results[role] = self._call(role, method, *args, **kw)
        else:
            for role in ("sub", main_role):  # the sub side applies what is complete before main publishes t
                method, args, kw = calls[role]
                results[role] = self._call(role, method, *args, **kw)
        metrics: dict[str, float] = {}
        advantages: dict[int, list[tuple[int, str, float]]] = {}
        for role in calls:  # main first, then sub: the order the metrics always had
            out = dict(results[role])
            advantages.update({int(k): v for k, v in out.pop("advantages", {}).items()})
            metrics.update(out)
        return metrics, advantages

    def committed(self, iteration: int) -> None:
        """The loop committed ``iteration``: the workers prune their older checkpoints."""
        for role in self.handles:
            self._call(role, "committed", iteration)

    def end_stage(self, stage_index: int) -> None:
        if self.config.checkpoint:
            for role in self.handles:
                self._call(role, "end_stage", stage_index)

    def finish(self, last_iteration: int) -> dict[str, Any]:
        if self.staleness and "sub" in self.handles and last_iteration >= 0:
            return self._call("sub", "flush", last_iteration)
        return {}

    def placement_metrics(self) -> dict[str, float]:
        return {"restarts": float(len(self.restarts))}

    def close(self) -> None:
        for handle in self.handles.values():
            handle.close()
