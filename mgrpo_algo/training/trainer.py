"""The M-GRPO iteration loop, one for every mode and every placement, top to bottom like CleanRL.

One iteration::

    tasks    = B questions of the current curriculum stage      (rng keyed by seed and iteration)
    records  = collect(tasks, K rollouts)                       # env + tools; the env pays R_M and R_S
    d        = align_d, or chosen from the sub-agent counts seen
    main     = score_main_side(records)                         # A_M per query (the R_M the env paid)
    roles.update(main, facts)                                   # main learner; the sub worker scores R_S, A_S itself
    log main/..., sub/..., align/..., time/...

Modes: ``mgrpo`` (both roles learn), ``frozen-sub`` (only the main agent learns), ``single-agent``
(one agent with all the tools; GRPO with R = a1*format + a2*correct).

Placement (``TrainConfig.placement``) only changes where the role workers
(:class:`mgrpo_algo.training.roles.RoleWorker`, one per role, :class:`~mgrpo_algo.training.workers.RoleWorkers`)
live: in this process (``local``; a worker's policy shares its learner's model object),
one process per role, or Ray actors. The loop, the workers, the scoring, the seeds and the commit
protocol are the same code in all of them, so the same seed gives the same run.
"""

from __future__ import annotations

import copy
import json
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import mgrpo_scenarios
from mgrpo_env import strict_json
from mgrpo_env.attribution import attribution_counts_by_question, attribution_rates, supports_attribution
from mgrpo_env.core import RewardConfig, expert_scorer
from mgrpo_env.episode import EpisodeRecord, write_jsonl
from mgrpo_env.mistakes import ENDING_RATE_KEYS, MISTAKE_RATE_KEYS, mistake_rates
from mgrpo_env.roles import ROLE_TABLE, ROLES
from mgrpo_env.rollout import CollectStats, collect
from mgrpo_env.tool_health import backend_failures
from mgrpo_scenarios import split_tasks

from ..core.config import MODES, TrainConfig, config_to_dict
from ..core.faults import FaultPoints
from ..core.kernels import check_in_force, kernel_state, not_in_force
from ..core.scoring import (
    COUNT_WINDOW,
    alignment_metrics,
    alignment_width,
    annotate_main,
    score_main_side,
    turn_credit,
)
from ..core.seeding import episode_seed, iteration_rngs
from .final_models import export_final_models
from .run_folder import run_store
from .storage import RunStorage
from .trajectories import write_json
from .workers import RoleWorkers

__all__ = ["Trainer", "role_model_paths"]

def role_model_paths(config: TrainConfig, scenario: Any, roles: list[str]) -> dict[str, str]:
    """The model path of each role: the configured one, or the tiny model built (and warm-started
    when ``warm_start.epochs > 0``) under ``models_dir``; built once and reused."""
    explicit = {role: config.role(role).model for role in roles}
    from ..policies.prebuilt import verify_folder

    for path in explicit.values():
        if path and Path(path).is_dir():
            verify_folder(path)  # a prebuilt start model (SHA256SUMS beside it) must match its checksums
    brought = [role for role, path in explicit.items() if not path and role not in ROLES]
    unbuilt = [role for role in brought if ROLE_TABLE[role].start_model is None]
    if unbuilt:
        raise ValueError(f"config field 'roles.{unbuilt[0]}.model' is needed: a registered role starts from a model "
                         "of its own (its path here, or a RoleSpec.start_model that brings one)")
    missing = [role for role, path in explicit.items() if not path and role in ROLES]  # tiny models: built below
    if missing:
        from ..policies.models import build_role_models

        teacher = config.warm_start.teacher
        stage2 = config.warm_start.epochs > 0 and teacher.enabled
        needed = list(missing)
        if stage2 and "single" in missing and teacher.single_matches_hierarchy:
            needed += [r for r in ("main", "sub") if r not in needed]  # the single agent's budget is theirs together
        built = build_role_models(
            scenario, config.models_dir, {r: config.model_sizes.get(r, {}) for r in needed}, seed=config.model_seed,
            roles=needed,
        )
        paths = {role: str(built[role]) for role in needed}
        if config.warm_start.epochs > 0:
            from ..learning.warmstart import warm_start

            warm = warm_start(scenario, paths, Path(config.models_dir) / "warm", config.warm_start, limits=config.limits,
                              tools=config.tools)
            paths = {role: str(path) for role, path in warm.items()}
        if stage2:
            from ..learning.teacher_stage import STAGE_ROLES, teacher_warm_start

            taught = teacher_warm_start(scenario, Path(config.models_dir) / "warm", Path(config.models_dir) / "teacher",
                                        config.warm_start, limits=config.limits, tools=config.tools,
                                        roles=[r for r in STAGE_ROLES if r in needed])
            paths = {role: str(path) for role, path in taught.items()}
        explicit.update({role: paths[role] for role in missing})
    bases: dict[str, dict[str, str]] = {}  # per env: its built-in roles' start models, each resolved once
    for role in brought:  # made from those, this run's as resolved above, the others as usual
        env = ROLE_TABLE[role].env
        if env not in bases:
            own = [r for r in ROLES if ROLE_TABLE[r].env == env]
            bases[env] = {r: explicit[r] for r in own if r in explicit}
            others = [r for r in own if r not in explicit]
            bases[env].update(role_model_paths(config, scenario, others) if others else {})
        folder = Path(config.models_dir) / "roles" / role
        folder.parent.mkdir(parents=True, exist_ok=True)
        explicit[role] = str(ROLE_TABLE[role].start_model(bases[env], str(folder)))
    return explicit


def mode_model_paths(config: TrainConfig, scenario: Any, mode: str) -> dict[str, str]:
    """:func:`role_model_paths` of a mode's roles, a shared role's being its owner's (``ModeSpec.shares``);
    a mode that names its own start models (``ModeSpec.start``) starts from them, in place of the
    config's ``<role>.model`` (checked like any other: ``mgrpo train`` and ``mgrpo compare`` alike)."""
    spec = MODES[mode]
    if spec.start:
        config = copy.deepcopy(config)
        for role, path in spec.start:
            config.role(role).model = str(path)
    paths = role_model_paths(config, scenario, list(spec.workers))
    return {role: paths[spec.owner(role)] for role in spec.roles}


def reward_config(config: TrainConfig, scenario: Any, judge: Any = None) -> RewardConfig:
    """The env's rewards as ``config`` sets them (weights, expert reference and judge, format gate)."""
    return RewardConfig(config.main_weights, config.sub_weights,
                        expert_scorer(judge, reference=config.expert_reference, scenario=scenario),
                        sub_format_gate=config.sub_format_gate,
                        terms={role: config.role_terms(role) for role in config.reward_terms},
                        called={role: config.called_side(role)[:2] for role in config.roles if ROLE_TABLE[role].called_by})


def env_options(config: TrainConfig, rewards: RewardConfig) -> dict[str, Any]:
    """The env's keyword arguments of a run (training and evaluation alike): limits, rewards and, when
    the config chooses them, each role's tools."""
    return {"limits": config.limits, "rewards": rewards, **({"tools": config.tools} if config.tools else {})}


def oracle_stage_paths(config: TrainConfig, roles: list[str]) -> dict[str, str]:
    """The first warm-start stage's folders (the oracle clone), as :func:`role_model_paths` builds them."""
    return {role: str(Path(config.models_dir) / "warm" / role) for role in roles}


class Trainer:
    """Runs a :class:`TrainConfig`: builds the role workers where ``config.placement`` says, then every
    stage's iterations; ``config.resume`` resumes after the last committed iteration (``loop_state.json``).

    An iteration commits in this order: each worker applies it and checkpoints (its own atomic commit
    point, ``workers/<role>/checkpoints/iter-<t>``), the loop appends its ``episodes.jsonl`` and
    ``metrics.jsonl`` lines, then writes ``loop_state.json`` (atomic: the run's commit point; it records
    the two files' sizes, so a resumed run cuts lines of an iteration that was not committed), then the
    workers prune older checkpoints. A kill anywhere redoes at most the uncommitted iteration, with the
    same seeds, so a resumed run ends with the parameters of an uninterrupted one (tested)."""

    def __init__(self, config: TrainConfig, *, log: Callable[[dict[str, Any]], None] | None = None,
                 heldout: Callable[[int], Mapping[str, float]] | None = None) -> None:
        """``log``: called with each committed iteration's metrics. ``heldout``: called after each
        iteration's update with the number of updates applied; the figures it returns (a held-out curve
        point, or nothing) join that iteration's ``metrics.jsonl`` line as ``heldout/<name>``."""
        self.config = config
        self._heldout = heldout
        self.scenario = mgrpo_scenarios.get(config.scenario, **config.scenario_kwargs)
        if config.delegation_credit and not supports_attribution(self.scenario):
            raise ValueError(f"delegation_credit needs a scenario that judges delegations against gold hops "
                             f"(mgrpo_scenarios.AttributesDelegations); {config.scenario!r} does not")
        self.out = Path(config.out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self._log_extra = log
        self.faults = FaultPoints.from_env(self.out)  # MGRPO_FAULT, read once (crash tests)
        placement = config.placement
        store = run_store(self.out, placement.store)
        self.storage = RunStorage.of_run(self.out, placement.storage)  # the workers' state (the run folder by default)
        self.storage.create()
        # the config, and what decides the float rounding of this run (CPU, kernels in force, versions, threads)
        check_in_force()
        unpinned = not_in_force(config.kernels.pin)  # a library caller that did not pin: said, not silent
        if unpinned:
            warnings.warn(unpinned, stacklevel=2)
        (self.out / "config.json").write_text(strict_json.dumps({**config_to_dict(config), "provenance": kernel_state()},
                                                                indent=2, default=str) + "\n")
        # the env pays R_M and R_S once, with the judge wherever the roles run
        self.reward_config = reward_config(config, self.scenario, config.expert_judge.make())
        self._warned_no_expert = False
        self.mode = MODES[config.mode]
        paths = self.model_paths = mode_model_paths(config, self.scenario, config.mode)
        state = self.out / "loop_state.json"
        saved = json.loads(state.read_text()) if config.resume and state.exists() else None
        committed = int(saved["iteration"]) if saved else -1
        self.roles = RoleWorkers(config, paths, self.out, store=store, committed=committed)
        behind = {role: s["last_applied"] for role in self.mode.trained
                  if (s := self.roles.clients[role].status())["last_applied"] < committed - placement.staleness}
        if behind:
            self.roles.close()
            raise ValueError(f"cannot resume {self.out}: no checkpoint of iteration {committed} for {sorted(behind)} "
                             f"under {self.storage.path('workers')}")
        self.iteration = self.roles.start_iteration
        self.observed_counts: list[int] = []
        if saved:  # a resumed run chooses d from the counts seen before
            self.observed_counts = saved["observed_counts"]
            # a kill between appending an iteration's lines and committing it left lines to drop
            for name in ("metrics.jsonl", "episodes.jsonl"):
                path, size = self.out / name, saved.get("bytes", {}).get(name)
                if size is not None and path.exists() and path.stat().st_size > size:
                    with path.open("r+b") as fh:
                        fh.truncate(size)

    @property
    def workers(self) -> dict[str, Any]:
        """The role workers by role, when they live in this process (``local``)."""
        return self.roles.workers

    @property
    def handles(self) -> dict[str, Any]:
        """The handle on each role worker, whatever the placement."""
        return self.roles.handles

    @property
    def restarts(self) -> list[dict[str, Any]]:
        """The workers restarted after a failure (role, during what, recovery time, status)."""
        return self.roles.restarts

    def run(self) -> list[dict[str, Any]]:
        history = []
        done = 0
        with self.scenario.open() as world:
            for stage_index, stage in enumerate(self.config.stages):
                # "a+b" mixes splits: each batch draws from their union (one split: its tasks, as before)
                tasks = split_tasks(self.scenario, stage.split)
                for _ in range(stage.iterations):
                    if done >= self.iteration:  # a resumed run skips the iterations already applied
                        history.append(self.train_iteration(world, tasks, stage.split))
                    done += 1
                self.roles.end_stage(stage_index)
        self.roles.finish(self.iteration - 1)  # a stale run's last sub iterations
        export_final_models(self.roles.clients, self.out, self.config.placement.storage)  # OUT_DIR/final/<role>/
        return history

    def train_iteration(self, world: Any, tasks: list[Any], split: str) -> dict[str, Any]:
        cfg, t = self.config, self.iteration
        t_start = time.perf_counter()
        task_rng, _ = iteration_rngs(cfg.seed, t)  # the alignment draws are the sub worker's (same seeds)
        batch = [tasks[i] for i in task_rng.choice(len(tasks), size=min(cfg.questions_per_iteration, len(tasks)), replace=False)]
        stats = CollectStats()
        seed = episode_seed(cfg.seed, t)
        single = self.mode.single

        def run(policies: dict[str, Any]) -> list[EpisodeRecord]:
            return collect(self.scenario, batch, cfg.group_size, policies, world=world, seed=seed, max_workers=cfg.max_workers,
                           env_kwargs=env_options(cfg, self.reward_config), stats=stats, env=self.mode.env)

        records = self.roles.collect(t, run)
        t_collected = time.perf_counter()
        self.observed_counts = (self.observed_counts + [r.num_subs for r in records])[-COUNT_WINDOW:]
        d = 0 if single else alignment_width(self.observed_counts, cfg.align_d, cfg.align_quantile)
        main, metrics = score_main_side(records, cfg.group_size, role=self.mode.roles[0], step_weight=cfg.step_advantage_weight,
                                        estimator=cfg.main_estimator, credit=turn_credit(cfg))
        if not single:
            metrics.update(alignment_metrics(records, d))
        t_scored = time.perf_counter()
        metrics.update(self.roles.update(t, main, records, d))  # the sub side scores itself and keeps its A_S
        annotate_main(records, main)  # the loop's own A_M; the token ids stay with the workers that sampled them:
        for index, record in enumerate(records):  # the records carry the key to them
            record.trajectory_key = {"iteration": t, "index": index}
        if metrics.get("sub/expert_disabled") and not self._warned_no_expert:
            print("note: r_expert is off (b3 = 0) for sub-agents of tasks without per-hop gold answers; "
                  "set expert_judge to score them with an LLM judge", flush=True)
            self._warned_no_expert = True
        t_updated = time.perf_counter()
        if self._heldout is not None:  # a held-out curve point, in this iteration's line
            point = self._heldout(t + 1)
            if point:
                metrics.update({f"heldout/{name}": value for name, value in point.items()})
                metrics["time/heldout"] = time.perf_counter() - t_updated
        self.faults.hit("loop_after_update", role="loop", iteration=t)
        write_jsonl(self.out / "episodes.jsonl", records, append=True)
        metrics.update(self.roles.placement_metrics())
        failures = backend_failures(records)  # a missing browser or search backend degrades results: say so
        metrics["tools/backend_failures"] = sum(failures.values())
        metrics.update({f"tools/backend_failures/{kind.replace(' ', '_')}": n for kind, n in failures.items()})
        # the decision mistakes the imperfect-teacher start makes (mgrpo_env.mistakes): RL should remove them
        rates = mistake_rates(records, cfg.limits.max_delegations)
        metrics.update({f"mistakes/{k}": v for k, v in rates.items()
                        if k in (*MISTAKE_RATE_KEYS, "delegations", *ENDING_RATE_KEYS) and v is not None})
        # which role lost each training answer (mgrpo_env.attribution; a scenario with the hook, hierarchy modes)
        attributed = attribution_rates(attribution_counts_by_question(records, self.scenario))
        metrics.update({f"attribution/{k}": v for k, v in attributed.items()
                        if v is not None and k.count("/") == 1 and attributed.get("episodes")})
        metrics.update({
            "iteration": t,
            "split": split,
            "rollouts": len(records),
            "time/generation": stats.policy_s,
            "time/tools": stats.tool_s,
            "time/env_steps": stats.step_s,
            "time/collect": t_collected - t_start,
            "time/scoring": t_scored - t_collected,
            "time/update": t_updated - t_scored,
            "time/iteration": t_updated - t_start,
        })
        with (self.out / "metrics.jsonl").open("a") as fh:
            fh.write(strict_json.dumps(metrics) + "\n")
        self.faults.hit("loop_before_commit", role="loop", iteration=t)
        # commit: the workers checkpointed t when they applied it; loop_state.json (atomic) names t and the sizes
        sizes = {name: (self.out / name).stat().st_size for name in ("metrics.jsonl", "episodes.jsonl")}
        write_json(self.out / "loop_state.json", {"iteration": t, "observed_counts": self.observed_counts, "bytes": sizes})
        self.roles.committed(t)
        if self._log_extra is not None:
            self._log_extra(metrics)
        self.iteration += 1
        return metrics

    def close(self) -> None:
        self.roles.close()

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
