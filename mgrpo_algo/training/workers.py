"""The roles of a run, one :class:`~mgrpo_algo.training.roles.RoleWorker` each, wherever they run.

:class:`RoleWorkers` is what the iteration loop (:class:`mgrpo_algo.training.trainer.Trainer`) runs on,
for every placement: ``local`` puts the workers in this process (a local handle: arguments by
reference), ``processes`` one process per role, ``ray`` Ray actors. The loop drives the environments
and asks the workers for actions, as text; each worker keeps the token trajectories it generated (the
records carry only their key, ``EpisodeRecord.trajectory_key``). After a batch the loop scores the
main side and sends the main worker its slots (:class:`~mgrpo_algo.core.scoring.MainSlot`); it
publishes per rollout (query, rollout, correct, format, R_M) to the store and updates. The sub worker
gets only what it knows of its own trajectories (:class:`~mgrpo_algo.core.scoring.CalledFact`: format
flag, expert score) and how to score them (:class:`~mgrpo_algo.core.scoring.CalledScoring`); it waits in
the store for the main statistics (synchronized) or lags behind them (stale), computes R_S and A_S
itself, keeps them, then updates. Every call is a typed :class:`~mgrpo_algo.training.service.RoleClient`
method; the payloads are those dataclasses.

Faults: a worker that dies (SIGKILL, crash) is restarted from its checkpoint; during collection the
iteration is re-collected (every worker reseeded for it: the same tokens are drawn), during an update
the update is re-sent; the worker's own state (committed buffers, ``last_applied`` carried by its
checkpoint) guarantees that nothing is lost or applied twice (tested with kills at every
``MGRPO_FAULT`` point, :mod:`mgrpo_algo.core.faults`).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from mgrpo_env.episode import EpisodeRecord
from mgrpo_env.rollout import PolicyRequest
from mgrpo_env.turn_requests import TurnSender

from ..core.config import MODES, TrainConfig
from ..core.kernels import MARKER, pin_env
from ..core.scoring import CalledScoring, MainSlot, RoleBatch, sub_facts, turn_credit
from ..distributed.placement import RoleServerDied, spawn
from .roles import RoleWorker
from .service import RoleClient, RoleService
from .storage import RunStorage

logger = logging.getLogger(__name__)

T = TypeVar("T")

__all__ = ["RoleWorkers", "WorkerPolicy"]



class WorkerPolicy:
    """The loop's view of a role worker as a policy: requests out, actions back (``act`` while
    training, ``eval_act`` for an evaluation). ``worker``: a :class:`RoleClient` or a placement handle."""

    def __init__(self, worker: Any, iteration: int | None = None) -> None:
        self.worker = worker if isinstance(worker, RoleClient) else RoleClient(worker)
        self.iteration = iteration
        self.sender = TurnSender()

    def __call__(self, requests: Sequence[PolicyRequest]) -> list[str]:
        # only what is new crosses: each agent's new messages and its episode key (the worker keeps the
        # chat and the token ids; the task and its gold answer stay here)
        turns = self.sender.compact(requests)
        if self.iteration is None:
            texts = self.worker.eval_act(turns)
        else:
            texts = self.worker.act(self.iteration, turns)
        self.sender.answered(requests)
        return texts

    def release(self, episode: int, agent: str) -> None:
        self.sender.release(episode, agent)
        if self.iteration is None:
            self.worker.eval_release(episode, agent)
        else:
            self.worker.release(episode, agent)


class RoleWorkers:
    """The mode's roles (:data:`~mgrpo_algo.core.config.MODES`) on workers placed by ``config.placement``."""

    def __init__(self, config: TrainConfig, paths: dict[str, str], out: Path, *, store: str, committed: int) -> None:
        placement = config.placement
        mode = MODES[config.mode]
        self.config, self.out = config, out
        self.staleness = placement.staleness
        self.kind = placement.kind
        if committed < 0:  # a fresh run: no worker state of an earlier one may leak in
            RunStorage.of_run(out, placement.storage).remove("workers")
        if mode.shares and self.staleness:
            raise ValueError(f"mode {config.mode!r} plays {dict(mode.shares)} with one model and one learner: "
                             "there is no sub learner to lag; set placement.staleness to 0")
        self.mode = mode
        self.handles: dict[str, Any] = {}  # one per worker: a shared role has none of its own
        # the kernel pin in force here (kernels.pin): a "processes" child inherits it anyway, a Ray actor on
        # a cluster started elsewhere does not; "local" shares this process's (and warns on any env)
        pinned = {} if self.kind == "local" else {k: os.environ[k] for k in pin_env(os.environ.get(MARKER, ""))
                                                  if k in os.environ}
        for role in mode.workers:
            kwargs = {
                "role": role, "model": paths[role], "run_dir": str(out), "store": store if not mode.single else "",
                "spec": config.role(role), "seed": config.seed, "torch_threads": config.torch_threads,
                "train": role in mode.trained, "keep_token_ids": config.keep_token_ids,
            }
            if placement.storage:  # the default ("": the run folder) passes nothing new
                kwargs["storage"] = placement.storage
            res = dict(placement.resources.get(role, {}))
            cpus, gpus = res.pop("num_cpus", 1), res.pop("num_gpus", 0)
            self.handles[role] = spawn(RoleWorker, kwargs, placement=self.kind, name=f"mgrpo-{role}", num_cpus=cpus,
                                       num_gpus=gpus, ray_options={"resources": res} if res else None, env=pinned,
                                       start_timeout_s=placement.start_timeout_s)
        #: The typed view of each handle (:class:`RoleService`), for every role of the mode (a shared role's is
        #: its owner's): every call below goes through them.
        owned = {role: RoleClient(handle) for role, handle in self.handles.items()}
        self.clients = {role: owned[mode.owner(role)] for role in mode.roles}
        if committed >= 0:  # a resumed run: every worker back to the loop's last committed iteration
            for client in owned.values():
                client.rollback(committed)
        self.start_iteration = committed + 1
        self.restarts: list[dict[str, Any]] = []
        self._iteration = self.start_iteration

    @property
    def workers(self) -> dict[str, RoleWorker]:
        """The worker objects, in this process only (``local``; empty otherwise)."""
        return {role: h._obj for role, h in self.handles.items() if getattr(h, "_obj", None) is not None}

    # -- fault handling -------------------------------------------------------------------------

    def _restart(self, role: str, during: str, error: BaseException) -> None:
        t0 = time.perf_counter()
        self.handles[role].restart()
        status = self.clients[role].status()
        recovery_s = time.perf_counter() - t0
        self.restarts.append({"role": role, "during": during, "iteration": self._iteration, "error": repr(error),
                              "recovery_s": recovery_s, "status": status})
        # one line a user sees (Python's last-resort handler prints warnings to stderr when none is set up)
        logger.warning("mgrpo: the %s worker died during %s of iteration %d (%s); restarted from its checkpoint "
                       "in %.1f s, %s asked again", role, during, self._iteration, error, recovery_s, during)

    def _call(self, role: str, call: Callable[[RoleClient], T], what: str) -> T:
        """``call(client)`` on ``role``'s worker; a worker that dies is restarted and asked again."""
        for _ in range(3):
            try:
                return call(self.clients[role])
            except RoleServerDied as exc:
                self._restart(role, what, exc)
        raise RuntimeError(f"the {role} worker kept dying during {what}")

    def _role_of(self, exc: RoleServerDied) -> str:
        return next(role for role, h in self.handles.items() if h.name == exc.name)

    # -- what the loop calls --------------------------------------------------------------------

    def collect(self, iteration: int, run: Callable[[dict[str, Any]], list[EpisodeRecord]]) -> list[EpisodeRecord]:
        self._iteration = iteration
        for _ in range(3):
            try:
                for role in self.handles:  # reseeded and emptied: a re-collection draws what the first did
                    self._call(role, lambda c: c.begin_collect(iteration), "begin_collect")
                records = run({role: WorkerPolicy(c, iteration) for role, c in self.clients.items()})
                for role in self.handles:
                    self.clients[role].commit(iteration)
                return records
            except RoleServerDied as exc:
                self._restart(self._role_of(exc), "collect", exc)  # then collected again from scratch
        raise RuntimeError(f"collection of iteration {iteration} kept failing")

    def update(self, iteration: int, slots: list[MainSlot], records: list[EpisodeRecord], d: int) -> dict[str, float]:
        """Each worker's update of ``iteration``: the root role (main or single) gets the slots the loop
        scored, every called role (sub, and any registered one) its own facts, and scores itself and keeps
        its A_S. Returns the metrics, the root's first, then the called roles' in the mode's order."""
        root = self.mode.roles[0]
        if self.mode.shares:  # one model plays every role: one update over all of them (the shared-model baseline)
            (shared, _), = self.mode.shares
            batch = RoleBatch(slots=slots, facts=sub_facts(records, shared), scoring=self._sub_scoring(d, shared))
            return dict(self._call(root, lambda c: c.update(iteration, batch), "update"))
        batches = {root: RoleBatch(slots=slots)}
        for role in self.called:
            batches[role] = RoleBatch(facts=sub_facts(records, role), scoring=self._sub_scoring(d, role),
                                      staleness=self.staleness)
        results: dict[str, dict[str, Any]] = {}
        if self.staleness == 0:
            # synchronized: all at once; a called role's worker waits in the store for this iteration's statistics
            futures = {role: self.clients[role].submit(RoleService.update, iteration, batch) for role, batch in batches.items()}
            for role, future in futures.items():
                try:
                    results[role] = future.result()
                except RoleServerDied as exc:
                    self._restart(role, "update", exc)
                    results[role] = self._call(role, lambda c, b=batches[role]: c.update(iteration, b), "update")
        else:
            for role in (*self.called, root):  # a called side applies what is complete before main publishes t
                results[role] = self._call(role, lambda c, b=batches[role]: c.update(iteration, b), "update")
        metrics: dict[str, float] = {}
        for role in batches:  # the root first, then the called roles: the order the metrics always had
            metrics.update(results[role])
        return metrics

    @property
    def called(self) -> tuple[str, ...]:
        """The roles with a worker of their own that the root agent calls (they score themselves)."""
        return tuple(role for role in self.handles if role != self.mode.roles[0])

    def _sub_scoring(self, d: int, role: str) -> CalledScoring:
        """How the called ``role``'s side scores an iteration of width ``d``."""
        cfg = self.config
        weights, format_gate, estimator, outcome_groups = cfg.called_side(role)
        return CalledScoring(cfg.group_size, d, cfg.align_strategy, cfg.step_advantage_weight, weights, estimator,
                             format_gate, turn_credit(cfg), outcome_groups, role, cfg.role_terms(role))

    def committed(self, iteration: int) -> None:
        """The loop committed ``iteration``: the workers prune their older checkpoints."""
        for role in self.handles:
            self._call(role, lambda c: c.committed(iteration), "committed")

    def end_stage(self, stage_index: int) -> None:
        if self.config.checkpoint:
            for role in self.handles:
                self._call(role, lambda c: c.end_stage(stage_index), "end_stage")

    def finish(self, last_iteration: int) -> dict[str, Any]:
        metrics: dict[str, Any] = {}
        if self.staleness and last_iteration >= 0:  # a stale run's last iterations of every called role
            for role in self.called:
                metrics.update(self._call(role, lambda c: c.flush(last_iteration), "flush"))
        return metrics

    def placement_metrics(self) -> dict[str, float]:
        return {"restarts": float(len(self.restarts))}

    def close(self) -> None:
        for handle in self.handles.values():
            handle.close()
