"""The M-GRPO trainer and its two baselines, top to bottom like CleanRL.

One iteration::

    tasks    = B questions of the current curriculum stage
    records  = collect(tasks, K rollouts)                  # env + tools + batched policies
    R_M      = [B, K] main rewards        -> A_M = main_advantages(R_M)
    plan     = align.plan(d_k per rollout, d)               # exactly d sub slots per rollout
    R_S      = [B, K, d] sub rewards      -> A_S = sub_advantages(R_S, mask)
    main learner.update(main sequences with A_M)
    sub learner.update(sub sequences with A_S)              # not in frozen-sub mode
    log main/..., sub/..., align/..., time/...

Modes: ``mgrpo`` (both roles learn), ``frozen-sub`` (only the main agent learns), ``single-agent``
(one agent with all the tools; GRPO with R = a1*format + a2*correct). Policies share their role
learner's model object, so rollouts always use the current weights without any copy.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers

import mgrpo_scenarios
from mgrpo_env import align
from mgrpo_env.core import RewardConfig, expert_scorer
from mgrpo_env.episode import EpisodeRecord, write_jsonl
from mgrpo_env.rollout import CollectStats, collect, collect_single

from .advantages import aligned_sub_advantages, group_stats, main_advantages
from .config import RoleConfig, TrainConfig, config_to_dict, single_agent_turns
from .hf_policy import TransformersPolicy
from .learner import RoleLearner
from .sequences import TokenSequence, trajectory_sequence

__all__ = ["Trainer", "score_iteration", "role_model_paths"]


def score_iteration(
    records: list[EpisodeRecord], k: int, d: int, strategy: str, rng: np.random.Generator, *, single: bool = False
) -> tuple[list[TokenSequence], list[TokenSequence], dict[str, float]]:
    """Records of B x K rollouts (task-major) -> main and sub training sequences, plus metrics.

    Main: A_M per query over its K rollouts. Sub: each rollout's sub-agents aligned to exactly d
    slots (duplicated / dropped at random; a rollout with no sub-agent gets d masked slots), A_S
    pooled per query over its unmasked d*K slots. A duplicated slot yields the same sequence twice.
    """
    if len(records) % k:
        raise ValueError(f"{len(records)} records is not a multiple of K={k}")
    b = len(records) // k
    agent = "single_0" if single else "main_0"
    main_r = np.array([[records[q * k + j].rewards[agent] for j in range(k)] for q in range(b)], dtype=np.float64)
    a_main = main_advantages(main_r)
    main_seqs = [
        _sequence(records[q * k + j].main, float(a_main[q, j]), "single" if single else "main", records[q * k + j])
        for q in range(b)
        for j in range(k)
    ]
    for q in range(b):  # kept with the episode (episodes.jsonl, mgrpo view)
        for j in range(k):
            records[q * k + j].components.setdefault(agent, {})["advantage"] = float(a_main[q, j])
    stats = group_stats(main_r)
    role = "single" if single else "main"
    metrics = {
        f"{role}/reward_mean": float(main_r.mean()),
        f"{role}/accuracy": float(np.mean([r.correct for r in records])),
        f"{role}/format_ok": float(np.mean([r.main.format_ok for r in records])),
        f"{role}/zero_std_groups": stats["zero_std_frac"],
    }
    if single:
        return main_seqs, [], metrics
    counts = [r.num_subs for r in records]
    slots, values, align_stats = aligned_sub_advantages([[s.reward for s in r.subs] for r in records], k, d,
                                                        strategy=strategy, rng=rng)
    sub_seqs = [_sequence(records[i].subs[sub], a, "sub", records[i]) for (i, _, sub), a in zip(slots, values, strict=True)]
    for (i, _, sub), a in zip(slots, values, strict=True):  # a duplicated slot repeats its original's advantage
        comp = records[i].components.setdefault(records[i].subs[sub].agent, {})
        comp["advantage"] = a
        comp["aligned_slots"] = comp.get("aligned_slots", 0) + 1
    metrics.update(
        {
            "sub/reward_mean": align_stats.pop("reward_mean"),
            "sub/expert_mean": float(np.mean([s.expert or 0.0 for r in records for s in r.subs])) if any(counts) else 0.0,
            "sub/format_ok": float(np.mean([s.format_ok for r in records for s in r.subs])) if any(counts) else 0.0,
            "align/d": float(d),
            "align/d_k_mean": float(np.mean(counts)),
            **{f"align/{key}": value for key, value in align_stats.items()},
        }
    )
    return main_seqs, sub_seqs, metrics


def _sequence(trajectory: Any, advantage: float, role: str, record: EpisodeRecord) -> TokenSequence:
    ids, mask, logps = trajectory_sequence([t.extra for t in trajectory.turns])
    return TokenSequence(ids, mask, advantage, sampled_logprobs=logps, role=role,
                         meta={"episode": record.episode_id, "agent": trajectory.agent, "reward": trajectory.reward})


def role_model_paths(config: TrainConfig, scenario: Any, roles: list[str]) -> dict[str, str]:
    """The model path of each role: the configured one, or the tiny model built (and warm-started
    when ``warm_start.epochs > 0``) under ``models_dir``; built once and reused."""
    explicit = {role: getattr(config, role).model for role in roles}
    from .prebuilt import verify_folder

    for path in explicit.values():
        if path and Path(path).is_dir():
            verify_folder(path)  # a prebuilt start model (SHA256SUMS beside it) must match its checksums
    missing = [role for role, path in explicit.items() if not path]
    if missing:
        from .models import build_role_models

        built = build_role_models(
            scenario, config.models_dir, {r: config.model_sizes.get(r, {}) for r in missing}, seed=config.model_seed,
            roles=missing,
        )
        paths = {role: str(built[role]) for role in missing}
        if config.warm_start.epochs > 0:
            from .warmstart import warm_start

            warm = warm_start(scenario, paths, Path(config.models_dir) / "warm", config.warm_start, limits=config.limits)
            paths = {role: str(path) for role, path in warm.items()}
        explicit.update(paths)
    return explicit


class Trainer:
    """Runs a :class:`TrainConfig`: builds the roles, then every stage's iterations."""

    def __init__(self, config: TrainConfig, *, log: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.config = config
        transformers.utils.logging.disable_progress_bar()  # per-shard bars drown the training log
        torch.set_num_threads(config.torch_threads)
        torch.manual_seed(config.seed)
        self.rng = np.random.default_rng(config.seed)
        self.scenario = mgrpo_scenarios.get(config.scenario, **config.scenario_kwargs)
        self.out = Path(config.out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "config.json").write_text(json.dumps(config_to_dict(config), indent=2, default=str) + "\n")
        self._log_extra = log
        judge = None
        if config.expert_judge:
            from mgrpo_scenarios.verifiers import LLMJudge

            judge = LLMJudge(**config.expert_judge)
        self.reward_config = RewardConfig(config.main_weights, config.sub_weights, expert_scorer(judge))
        self._warned_no_expert = False
        self.iteration = 0
        self.observed_counts: list[int] = []
        self.learners: dict[str, RoleLearner] = {}
        self.policies: dict[str, Any] = {}
        self.syncs: dict[str, Any] = {}
        self.served_weights: dict[str, str] = {}
        roles = ["single"] if config.mode == "single-agent" else ["main", "sub"]
        paths = self._model_paths(roles)
        for role in roles:
            spec: RoleConfig = getattr(config, role)
            trains = not (config.mode == "frozen-sub" and role == "sub")
            if trains:
                learner = RoleLearner(role, paths[role], spec.learner)
                self.learners[role] = learner
                model: Any = learner.model
            else:
                model = paths[role]
            g = spec.generation
            if spec.served:
                self.policies[role] = self._served_policy(role, spec, paths[role])
                continue
            self.policies[role] = TransformersPolicy(
                model, paths[role], role=role, max_new_tokens=g.max_new_tokens, temperature=g.temperature,
                top_p=g.top_p, max_prompt_tokens=g.max_prompt_tokens, seed=config.seed + len(self.policies),
                kv_cache_mb=g.kv_cache_mb,
            )

    def _served_policy(self, role: str, spec: RoleConfig, model_path: str) -> Any:
        """An OpenAI-compatible policy on the role's served engine, and the weight sync that keeps it current."""
        from .http_policy import OpenAICompatiblePolicy
        from .weight_sync import WeightSync

        served = dict(spec.served)
        unknown = set(served) - {"base_url", "model", "weights_dir", "api_key"}
        if unknown or "base_url" not in served:
            raise ValueError(f"config field '{role}.served' needs base_url (and model, weights_dir); unknown: {sorted(unknown)}")
        g = spec.generation
        self.syncs[role] = WeightSync(served["base_url"], api_key=served.get("api_key"))
        self.served_weights[role] = served.get("weights_dir", "")
        return OpenAICompatiblePolicy(
            served["base_url"], served.get("model", model_path), role=role, tokenizer=model_path,
            max_new_tokens=g.max_new_tokens, temperature=g.temperature, top_p=g.top_p,
            max_prompt_tokens=g.max_prompt_tokens, api_key=served.get("api_key"),
        )

    def _push_weights(self, role: str) -> dict[str, float]:
        """After an update: the served engine samples from the new weights (LoRA adapter or full reload)."""
        learner, sync = self.learners[role], self.syncs[role]
        t0 = time.perf_counter()
        if learner.config.lora_rank > 0:
            name = f"{role}-step{learner.step}"
            folder = learner.save_adapter(self.out / "adapters" / name)
            self.policies[role].model = sync.sync_lora(folder, name)
        else:
            weights = self.served_weights[role]
            if not weights:
                raise ValueError(f"config field '{role}.served.weights_dir' is needed to push full weights")
            learner.model.save_pretrained(weights)
            sync.sync_full()
        return {f"{role}/weight_sync_s": time.perf_counter() - t0}

    def _model_paths(self, roles: list[str]) -> dict[str, str]:
        return role_model_paths(self.config, self.scenario, roles)

    def run(self) -> list[dict[str, Any]]:
        history = []
        with self.scenario.open() as world:
            for stage_index, stage in enumerate(self.config.stages):
                tasks = list(self.scenario.tasks(stage.split))
                for _ in range(stage.iterations):
                    history.append(self.train_iteration(world, tasks, stage.split))
                if self.config.checkpoint:
                    for role, learner in self.learners.items():
                        learner.save(self.out / "checkpoints" / f"stage{stage_index + 1}" / role)
        return history

    def train_iteration(self, world: Any, tasks: list[Any], split: str) -> dict[str, Any]:
        cfg = self.config
        t_start = time.perf_counter()
        chosen = self.rng.choice(len(tasks), size=min(cfg.questions_per_iteration, len(tasks)), replace=False)
        batch = [tasks[i] for i in chosen]
        stats = CollectStats()
        seed = cfg.seed + self.iteration * 10_000
        single = cfg.mode == "single-agent"
        if single:
            turns = single_agent_turns(cfg.limits)
            records = collect_single(
                self.scenario, batch, cfg.group_size, self.policies["single"], world=world, seed=seed,
                max_workers=cfg.max_workers, env_kwargs={"max_turns": turns, "main_weights": cfg.main_weights}, stats=stats,
            )
        else:
            records = collect(
                self.scenario, batch, cfg.group_size, self.policies, world=world, seed=seed, max_workers=cfg.max_workers,
                env_kwargs={**cfg.limits, "rewards": self.reward_config}, stats=stats,
            )
        t_collected = time.perf_counter()
        self.observed_counts += [r.num_subs for r in records]
        d = cfg.align_d or align.choose_d(self.observed_counts, cfg.align_quantile)
        main_seqs, sub_seqs, metrics = score_iteration(records, cfg.group_size, d, cfg.align_strategy, self.rng, single=single)
        sources = [c.get("expert_source") for r in records for a, c in r.components.items() if a.startswith("sub_")]
        if sources:
            metrics["sub/expert_disabled"] = sources.count("none") / len(sources)
            if metrics["sub/expert_disabled"] and not self._warned_no_expert:
                print("note: r_expert is off (b3 = 0) for sub-agents of tasks without per-hop gold answers; "
                      "set expert_judge to score them with an LLM judge", flush=True)
                self._warned_no_expert = True
        t_scored = time.perf_counter()
        role = "single" if single else "main"
        metrics.update(self.learners[role].update(main_seqs))
        if "sub" in self.learners:
            metrics.update(self.learners["sub"].update(sub_seqs))
        for served_role in self.syncs:
            if served_role in self.learners:
                metrics.update(self._push_weights(served_role))
        t_updated = time.perf_counter()
        write_jsonl(self.out / "episodes.jsonl", records, append=True)
        metrics.update(
            {
                "iteration": self.iteration,
                "split": split,
                "rollouts": len(records),
                "time/generation": stats.policy_s,
                "time/tools": stats.tool_s,
                "time/env_steps": stats.step_s,
                "time/collect": t_collected - t_start,
                "time/scoring": t_scored - t_collected,
                "time/update": t_updated - t_scored,
                "time/iteration": t_updated - t_start,
            }
        )
        with (self.out / "metrics.jsonl").open("a") as fh:
            fh.write(json.dumps(metrics) + "\n")
        if self._log_extra is not None:
            self._log_extra(metrics)
        self.iteration += 1
        return metrics
