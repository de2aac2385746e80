"""Decoupled M-GRPO: each role on its own server, only statistics crossing through a shared store.

The controller drives the environments and asks the role servers for actions; each server keeps
the token trajectories it generated, so what travels is text in and text out. After a batch, the
controller tells each server its own rewards: the main server publishes per rollout its
correctness and format flag to the store and updates; the sub server reads those statistics to
compute R_S, aligns its trajectories and updates. Placement (``local``, ``processes``, ``ray``)
only changes where the servers live.

Modes: synchronized (``staleness=0``, the paper's better variant: the sub learner updates on the
same iteration once the main statistics are in) and stale(n) (the sub learner may lag up to n
iterations: it applies what is complete and waits only for older iterations).

Faults: a server that dies (SIGKILL, crash) is restarted from its checkpoint; during collection the
iteration is re-collected, during an update the update is re-sent, and the server's own state
(committed buffers, ``last_applied``) guarantees that no statistic is lost or applied twice.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

import mgrpo_scenarios
from mgrpo_env.core import RewardConfig, expert_scorer
from mgrpo_env.episode import write_jsonl
from mgrpo_env.rollout import CollectStats, PolicyRequest, collect

from .config import TrainConfig, config_to_dict
from .placement import RoleServerDied, spawn
from .roles import RoleServer
from .trainer import role_model_paths

__all__ = ["DecoupledTrainer"]


class _RemotePolicy:
    """The controller's view of a role server as a policy: requests out, texts back."""

    def __init__(self, trainer: DecoupledTrainer, role: str, iteration: int) -> None:
        self.trainer, self.role, self.iteration = trainer, role, iteration

    def __call__(self, requests: Sequence[PolicyRequest]) -> list[str]:
        light = [PolicyRequest(r.episode, r.agent, r.role, r.observation, r.messages, r.task) for r in requests]
        return self.trainer.handles[self.role].call("act", self.iteration, light)


class DecoupledTrainer:
    """Runs a :class:`TrainConfig` (modes ``mgrpo`` and ``frozen-sub``) with role servers."""

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
        if staleness < 0:
            raise ValueError("staleness must be >= 0 (0 = synchronized)")
        self.config = config
        self.placement = placement
        self.staleness = staleness
        self.out = Path(config.out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.store_spec = store or f"sqlite:{self.out / 'stats.sqlite'}"
        (self.out / "config.json").write_text(json.dumps(
            {**config_to_dict(config), "placement": placement, "store": self.store_spec, "staleness": staleness},
            indent=2, default=str) + "\n")
        self.scenario = mgrpo_scenarios.get(config.scenario, **config.scenario_kwargs)
        self.rng = np.random.default_rng(config.seed)
        self._log = log
        self.reward_config = RewardConfig(config.main_weights, config.sub_weights, expert_scorer(None))
        paths = role_model_paths(config, self.scenario, ["main", "sub"])
        resources = resources or {}
        self.handles = {}
        for role in ("main", "sub"):
            spec = getattr(config, role)
            kwargs = {
                "role": role, "model": paths[role], "checkpoint_dir": str(self.out / "servers"), "store": self.store_spec,
                "learner": config_to_dict(spec.learner), "generation": config_to_dict(spec.generation),
                "sub_weights": tuple(config.sub_weights), "align_d": config.align_d, "align_quantile": config.align_quantile,
                "align_strategy": config.align_strategy, "seed": config.seed, "torch_threads": config.torch_threads,
                "train": not (role == "sub" and config.mode == "frozen-sub"),
            }
            res = resources.get(role, {})
            self.handles[role] = spawn(RoleServer, kwargs, placement=placement, name=f"mgrpo-{role}",
                                       num_cpus=res.get("num_cpus", 1), num_gpus=res.get("num_gpus", 0))
        self.iteration = max(self.handles[r].call("status")["last_applied"] for r in ("main", "sub")) + 1
        self.restarts: list[dict[str, Any]] = []

    # -- fault handling --------------------------------------------------------------------------

    def _restart(self, role: str, during: str, error: BaseException) -> None:
        t0 = time.perf_counter()
        self.handles[role].restart()
        status = self.handles[role].call("status")
        self.restarts.append({"role": role, "during": during, "iteration": self.iteration, "error": repr(error),
                              "recovery_s": time.perf_counter() - t0, "status": status})

    def _call(self, role: str, method: str, *args: Any, **kwargs: Any) -> Any:
        for _ in range(3):
            try:
                return self.handles[role].call(method, *args, **kwargs)
            except RoleServerDied as exc:
                self._restart(role, method, exc)
        raise RuntimeError(f"the {role} server kept dying during {method}")

    # -- the loop -------------------------------------------------------------------------------

    def run(self) -> list[dict[str, Any]]:
        history = []
        done = 0
        with self.scenario.open() as world:
            for stage in self.config.stages:
                tasks = list(self.scenario.tasks(stage.split))
                for _ in range(stage.iterations):
                    if done < self.iteration:  # resumed run: iterations already applied are skipped
                        done += 1
                        continue
                    history.append(self.train_iteration(world, tasks, stage.split))
                    done += 1
        if self.staleness and self.config.mode == "mgrpo":
            self._call("sub", "flush", self.iteration - 1)
        return history

    def _collect(self, world: Any, batch: list[Any], stats: CollectStats) -> list[Any]:
        cfg, t = self.config, self.iteration
        for _ in range(3):
            policies = {role: _RemotePolicy(self, role, t) for role in ("main", "sub")}
            try:
                records = collect(self.scenario, batch, cfg.group_size, policies, world=world, seed=cfg.seed + t * 10_000,
                                  max_workers=cfg.max_workers, env_kwargs={**cfg.limits, "rewards": self.reward_config},
                                  stats=stats)
                for role in ("main", "sub"):
                    self.handles[role].call("commit", t)
                return records
            except RoleServerDied as exc:
                role = "main" if exc.name == "mgrpo-main" else "sub"
                self._restart(role, "collect", exc)
                for other in ("main", "sub"):
                    self._call(other, "discard", t)  # the iteration is collected again from scratch
        raise RuntimeError(f"collection of iteration {t} kept failing")

    def train_iteration(self, world: Any, tasks: list[Any], split: str) -> dict[str, Any]:
        cfg, t = self.config, self.iteration
        started = time.perf_counter()
        batch = [tasks[i] for i in self.rng.choice(len(tasks), size=min(cfg.questions_per_iteration, len(tasks)), replace=False)]
        stats = CollectStats()
        records = self._collect(world, batch, stats)
        collected = time.perf_counter()
        k = cfg.group_size
        main_rollouts = [
            {"episode": i, "query": i // k, "rollout": i % k, "reward": r.rewards["main_0"], "correct": float(r.correct),
             "format_ok": r.main.format_ok}
            for i, r in enumerate(records)
        ]
        sub_rollouts = [
            {"episode": i, "query": i // k, "rollout": i % k,
             "subs": [{"agent": s.agent, "format_ok": s.format_ok, "expert": s.expert} for s in r.subs]}
            for i, r in enumerate(records)
        ]
        metrics: dict[str, Any] = {}
        if self.staleness == 0:
            # synchronized: both at once; the sub server waits in the store for this iteration's stats
            futures = {"main": self.handles["main"].submit("update_main", t, main_rollouts, k),
                       "sub": self.handles["sub"].submit("update_sub", t, sub_rollouts, k, staleness=0)}
            for role, future in futures.items():
                try:
                    metrics.update(future.result())
                except RoleServerDied as exc:
                    self._restart(role, "update", exc)
                    args = (t, main_rollouts, k) if role == "main" else (t, sub_rollouts, k)
                    method = "update_main" if role == "main" else "update_sub"
                    metrics.update(self._call(role, method, *args) if role == "main" else self._call(role, method, *args, staleness=0))
        else:
            metrics.update(self._call("sub", "update_sub", t, sub_rollouts, k, staleness=self.staleness))
            metrics.update(self._call("main", "update_main", t, main_rollouts, k))
        write_jsonl(self.out / "episodes.jsonl", records, append=True)
        metrics.update({
            "iteration": t, "split": split, "rollouts": len(records),
            "main/accuracy": float(np.mean([r.correct for r in records])),
            "time/collect": collected - started, "time/generation": stats.policy_s, "time/tools": stats.tool_s,
            "time/update": time.perf_counter() - collected, "time/iteration": time.perf_counter() - started,
            "restarts": len(self.restarts),
        })
        with (self.out / "metrics.jsonl").open("a") as fh:
            fh.write(json.dumps(metrics) + "\n")
        if self._log is not None:
            self._log(metrics)
        self.iteration += 1
        return metrics

    def close(self) -> None:
        for handle in self.handles.values():
            handle.close()

    def __enter__(self) -> DecoupledTrainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
