"""Decoupled M-GRPO: each role on its own server, only statistics crossing between them.

:class:`RoleServers` is what the iteration loop (:class:`mgrpo_algo.training.trainer.Trainer`) runs on when
``placement.kind`` is ``local``, ``processes`` or ``ray``. The loop drives the environments and asks
the role servers for actions; each server keeps the token trajectories it generated, so what travels
is text in and text out. After a batch the loop scores it (the same code as in process) and sends
each server its slots: keys and advantages, a few numbers per trajectory. The main server publishes
per rollout its correctness and format flag to the store (the statistics the paper shares between
roles) and updates; the sub server waits in the store for them (synchronized) or lags behind them
(stale), then updates. Placement only changes where the servers live.

Modes: synchronized (``staleness=0``, the paper's better variant: the sub learner updates on the
same iteration once the main statistics are in) and stale(n) (the sub learner may lag up to n
iterations: it applies what is complete and waits only for older iterations).

Faults: a server that dies (SIGKILL, crash) is restarted from its checkpoint; during collection the
iteration is re-collected (both servers reseeded for it: the same tokens are drawn), during an update
the update is re-sent, and the server's own state (committed buffers, ``last_applied`` carried by its
checkpoint) guarantees that no statistic is lost or applied twice: the final parameters equal those
of an uninterrupted run (tested with kills at every ``MGRPO_FAULT`` point, :mod:`mgrpo_algo.core.faults`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from mgrpo_env.episode import EpisodeRecord
from mgrpo_env.rollout import PolicyRequest

from ..core.config import TrainConfig, config_to_dict
from ..core.scoring import ScoredBatch, slot_payload
from ..distributed.placement import RoleServerDied, spawn
from .roles import RoleServer
from .trainer import Trainer

__all__ = ["RoleServers", "DecoupledTrainer"]


class _RemotePolicy:
    """The loop's view of a role server as a policy: requests out, texts back."""

    def __init__(self, servers: RoleServers, role: str, iteration: int) -> None:
        self.servers, self.role, self.iteration = servers, role, iteration

    def __call__(self, requests: Sequence[PolicyRequest]) -> list[str]:
        light = [PolicyRequest(r.episode, r.agent, r.role, r.observation, r.messages, r.task) for r in requests]
        return self.servers.handles[self.role].call("act", self.iteration, light)


class RoleServers:
    """The two roles (main, sub) on servers placed by ``config.placement`` (``local``, ``processes``, ``ray``)."""

    def __init__(self, config: TrainConfig, paths: dict[str, str], out: Path) -> None:
        placement = config.placement
        self.config = config
        self.staleness = placement.staleness
        self.handles: dict[str, Any] = {}
        for role in ("main", "sub"):
            spec = getattr(config, role)
            kwargs = {
                "role": role, "model": paths[role], "checkpoint_dir": str(out / "servers"), "store": placement.store,
                "learner": config_to_dict(spec.learner), "generation": config_to_dict(spec.generation),
                "seed": config.seed, "torch_threads": config.torch_threads,
                "train": not (role == "sub" and config.mode == "frozen-sub"),
            }
            res = placement.resources.get(role, {})
            self.handles[role] = spawn(RoleServer, kwargs, placement=placement.kind, name=f"mgrpo-{role}",
                                       num_cpus=res.get("num_cpus", 1), num_gpus=res.get("num_gpus", 0))
        self.start_iteration = max(self.handles[r].call("status")["last_applied"] for r in ("main", "sub")) + 1
        self.restarts: list[dict[str, Any]] = []
        self._iteration = self.start_iteration

    # -- fault handling --------------------------------------------------------------------------

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
        raise RuntimeError(f"the {role} server kept dying during {method}")

    # -- what the loop calls ---------------------------------------------------------------------

    def collect(self, iteration: int, run: Callable[[dict[str, Any]], list[EpisodeRecord]]) -> list[EpisodeRecord]:
        self._iteration = iteration
        for _ in range(3):
            try:
                for role in ("main", "sub"):  # reseeded and emptied: a re-collection draws what the first did
                    self._call(role, "begin_collect", iteration)
                records = run({role: _RemotePolicy(self, role, iteration) for role in ("main", "sub")})
                for role in ("main", "sub"):
                    self.handles[role].call("commit", iteration)
                return records
            except RoleServerDied as exc:
                role = "main" if exc.name == "mgrpo-main" else "sub"
                self._restart(role, "collect", exc)  # then collected again from scratch (begin_collect)
        raise RuntimeError(f"collection of iteration {iteration} kept failing")

    def update(self, iteration: int, batch: ScoredBatch, records: list[EpisodeRecord]) -> dict[str, float]:
        # keys and advantages only: each server rebuilds its sequences from the trajectories it kept
        main_slots = slot_payload(batch.main)
        sub_slots = slot_payload(batch.sub)
        calls = {"main": ("update_main", (iteration, main_slots), {}),
                 "sub": ("update_sub", (iteration, sub_slots, len(batch.main)), {"staleness": self.staleness})}
        metrics: dict[str, float] = {}
        if self.staleness == 0:
            # synchronized: both at once; the sub server waits in the store for this iteration's statistics
            futures = {role: self.handles[role].submit(method, *args, **kw) for role, (method, args, kw) in calls.items()}
            for role, future in futures.items():
                try:
                    metrics.update(future.result())
                except RoleServerDied as exc:
                    self._restart(role, "update", exc)
                    method, args, kw = calls[role]
                    metrics.update(self._call(role, method, *args, **kw))
        else:
            for role in ("sub", "main"):  # the sub side applies what is complete before main publishes t
                method, args, kw = calls[role]
                metrics.update(self._call(role, method, *args, **kw))
        return metrics

    def commit(self, iteration: int) -> None:
        """The servers checkpoint after every iteration they apply (their own commit point)."""

    def committed(self, iteration: int) -> None:
        """Nothing to clean up here."""

    def end_stage(self, stage_index: int) -> None:
        """The servers checkpoint after every iteration they apply."""

    def finish(self, last_iteration: int) -> None:
        if self.staleness and self.config.mode == "mgrpo" and last_iteration >= 0:
            self._call("sub", "flush", last_iteration)

    def placement_metrics(self) -> dict[str, float]:
        return {"restarts": float(len(self.restarts))}

    def close(self) -> None:
        for handle in self.handles.values():
            handle.close()


class DecoupledTrainer(Trainer):
    """:class:`Trainer` on role servers: ``placement``, ``store``, ``staleness`` and ``resources``
    set ``config.placement`` (kept for the ``mgrpo train --placement`` flags and older scripts)."""

    def __init__(
        self,
        config: TrainConfig,
        *,
        placement: str = "local",
        store: str | None = None,
        staleness: int = 0,
        resources: dict[str, dict[str, float]] | None = None,
        log: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        if config.mode not in ("mgrpo", "frozen-sub"):
            raise ValueError(f"decoupled training runs the two-role modes (mgrpo, frozen-sub), not {config.mode!r}")
        if placement == "in-process":
            raise ValueError("DecoupledTrainer needs a decoupled placement (local, processes, ray)")
        config.placement = replace(config.placement, kind=placement, store=store or config.placement.store,
                                   staleness=staleness, resources=dict(resources or config.placement.resources))
        super().__init__(config, log=log)

    @property
    def handles(self) -> dict[str, Any]:
        return self.roles.handles

    @property
    def restarts(self) -> list[dict[str, Any]]:
        return self.roles.restarts
