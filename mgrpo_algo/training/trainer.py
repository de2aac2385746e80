"""The M-GRPO iteration loop, one for every mode and every placement, top to bottom like CleanRL.

One iteration::

    tasks    = B questions of the current curriculum stage      (rng keyed by seed and iteration)
    records  = collect(tasks, K rollouts)                       # env + tools; the env pays R_M and R_S
    d        = align_d, or chosen from the sub-agent counts seen
    batch    = score_batch(records)                             # A_M per query; sub slots aligned, A_S pooled
    roles.update(batch)                                         # each role's learner, wherever it runs
    log main/..., sub/..., align/..., time/...

Modes: ``mgrpo`` (both roles learn), ``frozen-sub`` (only the main agent learns), ``single-agent``
(one agent with all the tools; GRPO with R = a1*format + a2*correct).

Placement (``TrainConfig.placement``) only changes what is underneath ``roles``: ``in-process``
(:class:`InProcessRoles`: learners and policies here; policies share their learner's model object,
so rollouts always use the current weights without a copy) or a decoupled one
(:class:`mgrpo_algo.training.decoupled.RoleServers`: each role on its own server). The loop, the scoring, the
seeds and the metrics are the same code in both, so the same seed gives the same run.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from pkgutil import resolve_name
from typing import Any

import mgrpo_scenarios
from mgrpo_env.core import RewardConfig, expert_scorer
from mgrpo_env.episode import EpisodeRecord, write_jsonl
from mgrpo_env.rollout import CollectStats, collect, collect_single
from mgrpo_env.tool_health import backend_failures

from ..core.config import TrainConfig, config_to_dict
from ..core.faults import FaultPoints
from ..core.scoring import COUNT_WINDOW, ScoredBatch, alignment_width, annotate, score_batch
from ..core.seeding import iteration_rngs, policy_seed
from ..core.sequences import slot_sequence
from .final_models import export_final_models
from .roles import _write_json  # the role servers' atomic JSON write: one copy

__all__ = ["Trainer", "InProcessRoles", "ROLE_BACKENDS", "role_model_paths", "trained_roles"]

def role_model_paths(config: TrainConfig, scenario: Any, roles: list[str]) -> dict[str, str]:
    """The model path of each role: the configured one, or the tiny model built (and warm-started
    when ``warm_start.epochs > 0``) under ``models_dir``; built once and reused."""
    explicit = {role: getattr(config, role).model for role in roles}
    from ..policies.prebuilt import verify_folder

    for path in explicit.values():
        if path and Path(path).is_dir():
            verify_folder(path)  # a prebuilt start model (SHA256SUMS beside it) must match its checksums
    missing = [role for role, path in explicit.items() if not path]
    if missing:
        from ..policies.models import build_role_models

        built = build_role_models(
            scenario, config.models_dir, {r: config.model_sizes.get(r, {}) for r in missing}, seed=config.model_seed,
            roles=missing,
        )
        paths = {role: str(built[role]) for role in missing}
        if config.warm_start.epochs > 0:
            from ..learning.warmstart import warm_start

            warm = warm_start(scenario, paths, Path(config.models_dir) / "warm", config.warm_start, limits=config.limits)
            paths = {role: str(path) for role, path in warm.items()}
        explicit.update(paths)
    return explicit


def trained_roles(config: TrainConfig) -> list[str]:
    """The roles whose learner updates in ``config.mode``."""
    return {"mgrpo": ["main", "sub"], "frozen-sub": ["main"], "single-agent": ["single"]}[config.mode]


class InProcessRoles:
    """Learners and policies in this process (placement ``in-process``; every mode).

    With ``config.checkpoint`` every learner is saved after each iteration (:meth:`commit`, before the
    loop commits ``loop_state.json``); with ``config.resume`` the learners restart from the checkpoint
    of the last committed iteration."""

    def __init__(self, config: TrainConfig, paths: dict[str, str], out: Path) -> None:
        import torch
        import transformers

        from ..learning.learner import RoleLearner
        from ..policies.hf_policy import TransformersPolicy

        transformers.utils.logging.disable_progress_bar()  # per-shard bars drown the training log
        torch.set_num_threads(config.torch_threads)
        torch.manual_seed(config.seed)
        self.config, self.out = config, out
        self.learners: dict[str, Any] = {}
        self.policies: dict[str, Any] = {}
        self.syncs: dict[str, Any] = {}
        for role in paths:
            spec = getattr(config, role)
            model: Any = paths[role]
            if role in trained_roles(config):
                self.learners[role] = RoleLearner(role, paths[role], spec.learner)
                model = self.learners[role].model
            g = spec.generation
            if spec.served.enabled:
                self.policies[role] = self._served_policy(role, paths[role])
                continue
            self.policies[role] = TransformersPolicy(
                model, paths[role], role=role, max_new_tokens=g.max_new_tokens, temperature=g.temperature,
                top_p=g.top_p, max_prompt_tokens=g.max_prompt_tokens, seed=policy_seed(config.seed, role, 0),
                kv_cache_mb=g.kv_cache_mb, decode=g.decode, sampler=g.sampler,
            )
            if role in self.learners and self.learners[role].tokenizer is None:
                # checkpoints are complete Hugging Face folders (tokenizer and chat template with the weights)
                self.learners[role].tokenizer = self.policies[role].tokenizer
        self.start_iteration = 0
        state = out / "loop_state.json"
        if config.resume and state.exists():
            last = int(json.loads(state.read_text())["iteration"])
            folder = self._checkpoint(last)
            missing = [role for role in self.learners if not (folder / role / "learner.json").exists()]
            if missing:
                raise ValueError(f"cannot resume {out}: no checkpoint of iteration {last} for {missing} "
                                 f"under {folder} (a run with checkpoint: false cannot be resumed)")
            for role, learner in self.learners.items():
                learner.resume(folder / role)  # in place: the policy shares the model object
            self.start_iteration = last + 1

    def _checkpoint(self, iteration: int) -> Path:
        return self.out / "checkpoints" / f"iter-{iteration}"

    def _served_policy(self, role: str, model_path: str) -> Any:
        """An OpenAI-compatible policy on the role's served engine, and the weight sync that keeps it current."""
        from ..policies.http_policy import OpenAICompatiblePolicy
        from ..policies.weight_sync import WeightSync

        spec = getattr(self.config, role)
        served, g = spec.served, spec.generation
        self.syncs[role] = WeightSync(served.base_url, api_key=served.api_key)
        return OpenAICompatiblePolicy(
            served.base_url, served.model or model_path, role=role, tokenizer=model_path,
            max_new_tokens=g.max_new_tokens, temperature=g.temperature, top_p=g.top_p,
            max_prompt_tokens=g.max_prompt_tokens, api_key=served.api_key,
        )

    def collect(self, iteration: int, run: Callable[[dict[str, Any]], list[EpisodeRecord]]) -> list[EpisodeRecord]:
        for role, policy in self.policies.items():  # sampling keyed by (seed, role, iteration, call), as on role servers
            if hasattr(policy, "reseed"):
                policy.reseed(policy_seed(self.config.seed, role, iteration))
        return run(self.policies)

    def update(self, iteration: int, batch: ScoredBatch, records: list[EpisodeRecord]) -> dict[str, float]:
        metrics: dict[str, float] = {}
        main_role = "single" if "single" in self.policies else "main"
        if main_role in self.learners:
            metrics.update(self.learners[main_role].update([
                slot_sequence([t.extra for t in records[m.key.index].main.turns], m.advantage, main_role,
                              turn_advantages=m.turn_advantages, episode=records[m.key.index].episode_id,
                              agent=m.agent, reward=m.reward)
                for m in batch.main
            ]))
        if "sub" in self.learners:
            metrics.update(self.learners["sub"].update([
                slot_sequence([t.extra for t in records[s.key.index].subs[s.sub].turns], s.advantage, "sub",
                              turn_advantages=s.turn_advantages, episode=records[s.key.index].episode_id,
                              agent=s.agent, reward=s.reward)
                for s in batch.sub
            ]))
        for role in self.syncs:
            if role in self.learners:
                metrics.update(self._push_weights(role))
        return metrics

    def _push_weights(self, role: str) -> dict[str, float]:
        """After an update: the served engine samples from the new weights (LoRA adapter or full reload)."""
        learner, sync = self.learners[role], self.syncs[role]
        t0 = time.perf_counter()
        if learner.config.lora_rank > 0:
            name = f"{role}-step{learner.step}"
            folder = learner.save_adapter(self.out / "adapters" / name)
            self.policies[role].model = sync.sync_lora(folder, name)
        else:
            weights = getattr(self.config, role).served.weights_dir
            if not weights:
                raise ValueError(f"config field '{role}.served.weights_dir' is needed to push full weights")
            learner.model.save_pretrained(weights)
            sync.sync_full()
        return {f"{role}/weight_sync_s": time.perf_counter() - t0}

    def commit(self, iteration: int) -> None:
        """Checkpoint every learner for ``iteration`` (each save atomic), before the loop commits it."""
        if self.config.checkpoint:
            for role, learner in self.learners.items():
                learner.save(self._checkpoint(iteration) / role)

    def committed(self, iteration: int) -> None:
        """``iteration`` is committed: older per-iteration checkpoints can go."""
        root = self.out / "checkpoints"
        for folder in root.glob("iter-*") if root.exists() else []:
            if folder.name != f"iter-{iteration}":
                shutil.rmtree(folder, ignore_errors=True)

    def end_stage(self, stage_index: int) -> None:
        if self.config.checkpoint:
            for role, learner in self.learners.items():
                learner.save(self.out / "checkpoints" / f"stage{stage_index + 1}" / role)

    def finish(self, last_iteration: int) -> None:
        """Nothing is pending in process."""

    def placement_metrics(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        """Nothing to stop in process."""


#: What the loop runs on, per ``placement.kind``: a class, or "module:class" imported on first use
#: (the decoupled backend imports this module for the loop, never the reverse: no import cycle).
ROLE_BACKENDS: dict[str, Any] = {
    "in-process": InProcessRoles,
    **{kind: "mgrpo_algo.training.decoupled:RoleServers" for kind in ("local", "processes", "ray")},
}


class Trainer:
    """Runs a :class:`TrainConfig`: builds the roles where ``config.placement`` says, then every
    stage's iterations. A decoupled placement resumes after the last iteration its servers applied; in
    process, ``config.resume`` resumes after the last committed iteration (``loop_state.json``).

    An iteration commits in this order: update, append its ``episodes.jsonl`` and ``metrics.jsonl``
    lines, checkpoint the in-process learners (``checkpoints/iter-<t>``), then write ``loop_state.json``
    (atomic: the commit point; it records the two files' sizes, so a resumed run cuts lines of an
    iteration that was not committed). A kill anywhere redoes at most the uncommitted iteration, with
    the same seeds, so a resumed run ends with the parameters of an uninterrupted one (tested)."""

    def __init__(self, config: TrainConfig, *, log: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.config = config
        self.scenario = mgrpo_scenarios.get(config.scenario, **config.scenario_kwargs)
        self.out = Path(config.out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self._log_extra = log
        self.faults = FaultPoints.from_env(self.out)  # MGRPO_FAULT, read once (crash tests)
        placement = config.placement
        if placement.decoupled and not placement.store:
            placement.store = f"sqlite:{self.out / 'stats.sqlite'}"
        (self.out / "config.json").write_text(json.dumps(config_to_dict(config), indent=2, default=str) + "\n")
        # the env pays R_M and R_S once, with the judge wherever the roles run
        self.reward_config = RewardConfig(config.main_weights, config.sub_weights, expert_scorer(config.expert_judge.make()))
        self._warned_no_expert = False
        roles = ["single"] if config.mode == "single-agent" else ["main", "sub"]
        paths = self.model_paths = role_model_paths(config, self.scenario, roles)
        backend = ROLE_BACKENDS[placement.kind]
        self.roles: Any = (resolve_name(backend) if isinstance(backend, str) else backend)(config, paths, self.out)
        self.iteration = self.roles.start_iteration
        self.observed_counts: list[int] = []
        state = self.out / "loop_state.json"
        if self.iteration and state.exists():  # a resumed run chooses d from the counts seen before
            saved = json.loads(state.read_text())
            self.observed_counts = saved["observed_counts"]
            # a kill between appending an iteration's lines and committing it left lines to drop
            for name in ("metrics.jsonl", "episodes.jsonl"):
                path, size = self.out / name, saved.get("bytes", {}).get(name)
                if size is not None and path.exists() and path.stat().st_size > size:
                    with path.open("r+b") as fh:
                        fh.truncate(size)

    @property
    def learners(self) -> dict[str, Any]:
        """The in-process learners by role (empty when the roles run on servers)."""
        return getattr(self.roles, "learners", {})

    @property
    def policies(self) -> dict[str, Any]:
        return getattr(self.roles, "policies", {})

    def run(self) -> list[dict[str, Any]]:
        history = []
        done = 0
        with self.scenario.open() as world:
            for stage_index, stage in enumerate(self.config.stages):
                tasks = list(self.scenario.tasks(stage.split))
                for _ in range(stage.iterations):
                    if done >= self.iteration:  # a resumed run skips the iterations already applied
                        history.append(self.train_iteration(world, tasks, stage.split))
                    done += 1
                self.roles.end_stage(stage_index)
        self.roles.finish(self.iteration - 1)
        export_final_models(self.roles, self.model_paths, self.out)  # OUT_DIR/final/<role>/: loadable as is
        return history

    def train_iteration(self, world: Any, tasks: list[Any], split: str) -> dict[str, Any]:
        cfg, t = self.config, self.iteration
        t_start = time.perf_counter()
        task_rng, align_rng = iteration_rngs(cfg.seed, t)
        batch = [tasks[i] for i in task_rng.choice(len(tasks), size=min(cfg.questions_per_iteration, len(tasks)), replace=False)]
        stats = CollectStats()
        seed = cfg.seed + t * 10_000
        single = cfg.mode == "single-agent"

        def run(policies: dict[str, Any]) -> list[EpisodeRecord]:
            if single:
                return collect_single(
                    self.scenario, batch, cfg.group_size, policies["single"], world=world, seed=seed,
                    max_workers=cfg.max_workers, env_kwargs={"limits": cfg.limits, "main_weights": cfg.main_weights},
                    stats=stats,
                )
            return collect(self.scenario, batch, cfg.group_size, policies, world=world, seed=seed, max_workers=cfg.max_workers,
                           env_kwargs={"limits": cfg.limits, "rewards": self.reward_config}, stats=stats)

        records = self.roles.collect(t, run)
        t_collected = time.perf_counter()
        self.observed_counts = (self.observed_counts + [r.num_subs for r in records])[-COUNT_WINDOW:]
        d = 0 if single else alignment_width(self.observed_counts, cfg.align_d, cfg.align_quantile)
        scored = score_batch(records, cfg.group_size, d, strategy=cfg.align_strategy, rng=align_rng, single=single,
                             step_weight=cfg.step_advantage_weight)
        annotate(records, scored)
        metrics: dict[str, Any] = dict(scored.metrics)
        if metrics.get("sub/expert_disabled") and not self._warned_no_expert:
            print("note: r_expert is off (b3 = 0) for sub-agents of tasks without per-hop gold answers; "
                  "set expert_judge to score them with an LLM judge", flush=True)
            self._warned_no_expert = True
        t_scored = time.perf_counter()
        metrics.update(self.roles.update(t, scored, records))
        t_updated = time.perf_counter()
        self.faults.hit("loop_after_update", role="loop", iteration=t)
        write_jsonl(self.out / "episodes.jsonl", records, append=True)
        metrics.update(self.roles.placement_metrics())
        failures = backend_failures(records)  # a missing browser or search backend degrades results: say so
        metrics["tools/backend_failures"] = sum(failures.values())
        metrics.update({f"tools/backend_failures/{kind.replace(' ', '_')}": n for kind, n in failures.items()})
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
            fh.write(json.dumps(metrics) + "\n")
        self.faults.hit("loop_before_commit", role="loop", iteration=t)
        # commit: checkpoints first, then loop_state.json (atomic) names t and the file sizes that go with it
        self.roles.commit(t)
        sizes = {name: (self.out / name).stat().st_size for name in ("metrics.jsonl", "episodes.jsonl")}
        _write_json(self.out / "loop_state.json", {"iteration": t, "observed_counts": self.observed_counts, "bytes": sizes})
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
