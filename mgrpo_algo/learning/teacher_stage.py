"""The warm start's second stage: fine-tune the oracle clone on an imperfect teacher's demonstrations.

Stage 1 (:func:`mgrpo_algo.learning.warmstart.warm_start`) clones the scripted oracle: the start
models copy names and values well but make no decision mistakes, so RL finds only idiosyncratic
copy errors to fix, and those do not transfer to held-out questions. Stage 2 (this module) shows the
stage-1 models demonstrations of :class:`mgrpo_env.teacher.ImperfectTeacher` (``warm_start.teacher``:
the mistake kinds and their rates), every episode kept, right or wrong, ``draws`` independent draws
of each training task, so the clone makes the teacher's mistakes at the teacher's rates: decision
mistakes that recur across questions, which is what RL is for.

The single agent gets the same teacher and rates, and (``single_matches_hierarchy``) as many
optimiser steps over both stages as the main and sub roles together, at the same ``batch_tokens``.
Everything is seeded; on CPU a rerun is bit-identical. Each role folder's ``warm_start.json`` keeps
the stage's key (a match is reused), the teacher's own accuracy and mistake rates on its
demonstrations, the training metrics and the step budget of both stages.

:func:`shared_teacher_warm_start` is the same stage for the shared-model baseline (one LLM plays the
main agent and the sub-agents, ``ModeSpec.shares``): one model, the owner's stage-1 model, fine-tuned on
both roles' teacher demonstrations together (each chat with its own role's system prompt), so that its
start knows the sub-agent's turns as well as the main agent's (``mgrpo warm-start --from DIR --shared``).
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from mgrpo_env import strict_json
from mgrpo_env.mistakes import mistake_rates
from mgrpo_env.rollout import collect
from mgrpo_env.teacher import ImperfectTeacher

from ..core.config import Limits, WarmStartConfig
from ..core.seeding import torch_threads
from ..policies.chat_tokens import load_tokenizer
from .warmstart import (
    Relabeled,
    demo_env_kwargs,
    demonstrations,
    episode_roles,
    sft_sequences,
    sft_train,
    token_budget_batches,
    token_groups,
    tools_key,
    turn_exact_match,
)

__all__ = ["teacher_demonstrations", "teacher_warm_start", "shared_teacher_warm_start", "RoleMix", "STAGE_ROLES",
           "SHARED_ROLES"]

#: The order roles are fine-tuned in: the single agent's budget is the other two's sum.
STAGE_ROLES = ("main", "sub", "single")
#: The roles one shared model plays, its owner first (the shared-model baseline's ``(("sub", "main"),)``).
SHARED_ROLES = ("main", "sub")
#: Tasks per ``collect`` call (bounds the episodes in flight; the teacher is fast).
_CHUNK = 100


def teacher_demonstrations(scenario: Any, world: Any, cfg: WarmStartConfig, *, single: bool,
                           limits: Limits | None = None, tools: Mapping[str, Sequence[str]] | None = None,
                           ) -> tuple[dict[str, list[Any]], dict[str, Any]]:
    """The teacher's chats per role ({"main", "sub"} or {"single"}), every episode kept, ``draws``
    draws of the first ``max_tasks`` tasks of each split (the last ``validation_tasks`` held out, as
    in stage 1), and the teacher's accuracy and :func:`~mgrpo_env.mistakes.mistake_rates` per draw.
    ``tools`` (the run's ``TrainConfig.tools``) chooses the tools the episodes show."""
    limits = limits or Limits()
    teacher = cfg.teacher
    rates = teacher.rates()
    roles = episode_roles("single" if single else "main")
    chats: dict[str, list[Any]] = {role: [] for role in roles}
    stats: dict[str, Any] = {}
    env_kwargs = demo_env_kwargs(limits, tools, single=single)
    for draw in range(teacher.draws):
        policies = {role: ImperfectTeacher(scenario, role, rates, seed=cfg.seed * 1000 + draw) for role in roles}
        records = []
        for split in cfg.splits:
            every = list(scenario.tasks(split))
            tasks = every[: max(0, len(every) - cfg.validation_tasks)][: cfg.max_tasks]
            for start in range(0, len(tasks), _CHUNK):
                records += collect(scenario, tasks[start:start + _CHUNK], 1, policies, world=world,
                                   env_kwargs=env_kwargs, env="single" if single else "hierarchy",
                                   seed=1000 * draw + start)
        for r in records:  # behaviour cloning: right or wrong, the teacher's decisions are what is shown
            if single:
                chats["single"].append(r.main.messages)
            else:
                chats["main"].append(r.main.messages)
                chats["sub"] += [s.messages for s in r.subs]
        rates_seen = mistake_rates(records, limits.max_delegations)
        stats[f"draw{draw}"] = {"accuracy": sum(r.correct for r in records) / max(1, len(records)), **rates_seen}
    return chats, stats


def _digest(path: Path) -> str:
    return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()[:16]


def _stage_key(scenario: Any, cfg: WarmStartConfig, role: str, start: Path, limits: Limits | None,
               tools: Mapping[str, Sequence[str]] | None = None) -> Any:
    key = {"stage": "teacher", "role": role, "teacher": asdict(cfg.teacher), "splits": cfg.splits,
           "max_tasks": cfg.max_tasks, "validation_tasks": cfg.validation_tasks, "batch_tokens": cfg.batch_tokens,
           "max_seq_tokens": cfg.max_seq_tokens, "beta2": cfg.beta2, "relabel": cfg.relabel, "seed": cfg.seed,
           "start": _digest(start), "scenario": scenario.metadata, "limits": asdict(limits or Limits()),
           **tools_key(tools, role)}
    return json.loads(json.dumps(key, default=str))


def _record_of(folder: Path) -> dict[str, Any] | None:
    """A role folder's warm_start.json, or None."""
    file = folder / "warm_start.json"
    return json.loads(file.read_text()) if file.is_file() else None


def _stage_steps_of(folder: Path) -> int:
    """Optimiser steps of the last teacher stage recorded in a role folder (0 when none)."""
    budget = (_record_of(folder) or {}).get("budget")
    return int(budget["teacher_stage_steps"]) if budget else 0


def _steps_of(folder: Path) -> int | None:
    """Optimiser steps recorded in a role folder's warm_start.json (both stages when it has both)."""
    record = _record_of(folder)
    if record is None:
        return None
    budget = record.get("budget")
    return int(budget["total_steps"]) if budget else int(record.get("metrics", {}).get("steps", 0)) or None


def teacher_warm_start(scenario: Any, start_dir: str | Path, out_dir: str | Path, cfg: WarmStartConfig, *,
                       limits: Limits | None = None, roles: Sequence[str] = STAGE_ROLES,
                       progress: bool = True, tools: Mapping[str, Sequence[str]] | None = None,
                       refresh: bool = False) -> dict[str, Path]:
    """Fine-tune ``start_dir/<role>`` (stage 1's models) into ``out_dir/<role>`` on the teacher's
    demonstrations; a role whose ``warm_start.json`` key matches is reused. Returns the role folders.
    ``tools`` (the run's ``TrainConfig.tools``) chooses the tools the demonstrations show (and joins
    the key), so the start models are shown the prompts the run shows them. ``refresh``: a teacher
    that makes no mistake is the point (the oracle's own demonstrations, to bring an oracle clone up to a
    changed world: ``mgrpo warm-start --refresh``), not refused."""
    from transformers import AutoModelForCausalLM

    start, out = Path(start_dir), Path(out_dir)
    teacher = cfg.teacher if refresh else _teacher_of(cfg)
    keys = {role: _stage_key(scenario, cfg, role, start / role, limits, tools) for role in roles}
    done = {role: out / role for role in roles}

    def reusable(role: str) -> bool:
        file = done[role] / "warm_start.json"
        return file.is_file() and json.loads(file.read_text()).get("key") == keys[role]

    todo = [role for role in roles if not reusable(role)]
    if not todo:
        return done
    chats: dict[str, list[Any]] = {}
    stats: dict[str, Any] = {}
    with scenario.open() as world:
        for single in sorted({role == "single" for role in todo}):
            got, seen = teacher_demonstrations(scenario, world, cfg, single=single, limits=limits, tools=tools)
            chats.update(got)
            stats.update({role: seen for role in got})
    sft = _stage_sft(cfg)
    with torch_threads(teacher.torch_threads):
        for role in [r for r in STAGE_ROLES if r in todo]:
            source = start / role
            tokenizer = load_tokenizer(str(source))
            model = AutoModelForCausalLM.from_pretrained(str(source))
            sequences, counts = _role_sequences(tokenizer, chats[role], role, cfg)
            shown = _relabeled(sequences, scenario, tokenizer, cfg)
            before = _steps_of(source) or 0
            epochs = float(teacher.role_epochs.get(role, 0.0))
            target_steps = None
            if role == "single" and teacher.single_matches_hierarchy and refresh:
                # a refresh changes no budget: the single agent gets the steps main and sub got in it
                target_steps = sum(_stage_steps_of(done[r]) for r in ("main", "sub"))
            elif role == "single" and teacher.single_matches_hierarchy:
                target_steps = sum((_steps_of(done[r]) or 0) for r in ("main", "sub")) - before
            if target_steps is not None:
                per_epoch = len(token_budget_batches(sequences, cfg.batch_tokens, random.Random(0)))
                # sft_train runs ceil(epochs * per_epoch) steps: half a step under the target lands on it
                epochs = max(0.0, (target_steps - 0.5) / max(1, per_epoch))
            metrics = sft_train(model, shown, sft, pad_id=tokenizer.pad_token_id or 0, desc=f"teacher stage {role}",
                                progress=progress, epochs=epochs)
            steps = int(metrics.get("steps", 0))
            target = done[role]
            _save_folder(model, tokenizer, source, target)
            budget = {"oracle_stage_steps": before, "teacher_stage_steps": steps, "total_steps": before + steps,
                      "batch_tokens": cfg.batch_tokens, "epochs": epochs,
                      "matched_to_hierarchy": target_steps is not None}
            record = {"key": keys[role], "counts": counts, "teacher": stats.get(role, {}), "metrics": metrics,
                      "budget": budget, "from": str(source)}
            (target / "warm_start.json").write_text(strict_json.dumps(record, indent=2, default=str) + "\n")
    return done


# -- one model for both roles (the shared-model baseline's start) --------------------------------------


class RoleMix(Sequence[tuple[list[int], list[int]]]):
    """Several roles' sequences as one training set: role ``r``'s appear ``epochs[r]`` times in it (a
    fraction adds that share of them, a seeded choice), so one pass over the mix is every role's epochs.

    Why a mix and not passes over the union: the roles' stage-2 epochs differ (main 3, sub 2 in the
    demo) and :func:`~mgrpo_algo.learning.warmstart.sft_train` takes one epoch count for its set; one
    pass over the mix keeps each role's exposure and the sum of both roles' steps, with the roles'
    sequences interleaved in every batch order. Stores indices, not copies.
    """

    def __init__(self, parts: Mapping[str, Sequence[tuple[list[int], list[int]]]], epochs: Mapping[str, float],
                 seed: int = 0) -> None:
        self.parts = dict(parts)
        self.index: list[tuple[str, int]] = []
        for role, sequences in self.parts.items():
            whole, fraction = int(epochs[role]), float(epochs[role]) - int(epochs[role])
            self.index += [(role, i) for _ in range(whole) for i in range(len(sequences))]
            extra = round(fraction * len(sequences))
            if extra:
                self.index += [(role, i) for i in sorted(random.Random(f"{seed}-{role}").sample(range(len(sequences)), extra))]

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, index: int) -> tuple[list[int], list[int]]:  # type: ignore[override]
        role, i = self.index[index]
        return self.parts[role][i]

    def shown(self) -> dict[str, int]:
        """Sequences per role in one pass (each role's sequences times its epochs)."""
        return {role: sum(r == role for r, _ in self.index) for role in self.parts}


def _tokenizer_fingerprint(tokenizer: Any) -> Any:
    """What makes two tokenizers read text alike: vocabulary, special tokens and chat template."""
    return (sorted(tokenizer.get_vocab().items()), list(tokenizer.all_special_tokens),
            getattr(tokenizer, "chat_template", None))


def _one_tokenizer(folders: Mapping[str, Path]) -> Any:
    """The tokenizer of ``folders`` (role -> model folder, the owner first); folders whose tokenizers
    differ are refused: one model reads every role's turns with one tokenizer, so a role whose start
    used another would be read with ids it never had."""
    loaded = {role: load_tokenizer(str(folder)) for role, folder in folders.items()}
    owner, *others = folders
    for role in others:
        if _tokenizer_fingerprint(loaded[role]) != _tokenizer_fingerprint(loaded[owner]):
            raise ValueError(f"the {role} start model's tokenizer ({folders[role]}) differs from the {owner} start "
                             f"model's ({folders[owner]}): a shared model reads both roles' turns with one tokenizer, "
                             "so both roles' start models must have been built with the same one")
    return loaded[owner]


def _validate(model: Any, sequences: Mapping[str, list[tuple[list[int], list[int]]]], pad_id: int) -> dict[str, Any]:
    return {role: turn_exact_match(model, seqs, pad_id=pad_id) for role, seqs in sequences.items() if seqs}


def shared_teacher_warm_start(scenario: Any, start_dir: str | Path, out_dir: str | Path, cfg: WarmStartConfig, *,
                              limits: Limits | None = None, roles: Sequence[str] = SHARED_ROLES,
                              progress: bool = True, tools: Mapping[str, Sequence[str]] | None = None) -> Path:
    """Fine-tune one model, ``start_dir/<roles[0]>`` (the owner's stage-1 model, as ``ModeSpec.shares``
    starts a shared role from its owner's model), on the teacher's demonstrations of every role of
    ``roles`` together, into ``out_dir`` (a ``from_pretrained`` folder); reused when its key matches.

    The demonstrations, sequences (each chat with its own role's system prompt), learning rate,
    schedule, batch tokens, relabelling and thread count are stage 2's (:func:`teacher_warm_start`);
    each role is shown its ``teacher.role_epochs`` (a :class:`RoleMix`), so the one model gets the
    steps of the per-role models together. ``warm_start.json`` also records each role's turn exact
    match on the oracle's demonstrations of the ``validation_tasks`` held-out tasks, before and after.

    Raises:
        ValueError: no teacher mistake enabled, a role outside the hierarchy (the single agent's
            episodes are another env), no role with epochs, or the roles' start tokenizers differ.
    """
    from transformers import AutoModelForCausalLM

    start, target = Path(start_dir), Path(out_dir)
    teacher = _teacher_of(cfg)
    roles = tuple(roles)
    if len(roles) < 2 or len(set(roles)) != len(roles) or not set(roles) <= set(SHARED_ROLES):
        raise ValueError(f"a shared model plays two or more distinct roles of the hierarchy {SHARED_ROLES}, got {roles}")
    epochs = {role: float(teacher.role_epochs.get(role, 0.0)) for role in roles}
    if not any(epochs.values()):
        raise ValueError(f"warm_start.teacher.role_epochs gives none of {roles} an epoch: nothing to fit")
    missing = [str(start / role) for role in roles if not (start / role).is_dir()]
    if missing:
        raise ValueError(f"no start model folder {missing[0]} (the shared stage starts from stage 1's role folders)")
    owner = roles[0]
    tokenizer = _one_tokenizer({role: start / role for role in roles})
    key = {**_stage_key(scenario, cfg, owner, start / owner, limits, tools), "stage": "teacher-shared", "roles": list(roles)}
    key = json.loads(json.dumps(key, default=str))
    record_file = target / "warm_start.json"
    if record_file.is_file() and json.loads(record_file.read_text()).get("key") == key:
        return target
    with scenario.open() as world:
        chats, seen = teacher_demonstrations(scenario, world, cfg, single=False, limits=limits, tools=tools)
        held = (demonstrations(scenario, world, cfg.splits, cfg.max_tasks, single=False, limits=limits,
                               held_out=cfg.validation_tasks, validation=True, tools=tools) if cfg.validation_tasks else {})
    sft = _stage_sft(cfg)
    pad_id = tokenizer.pad_token_id or 0
    with torch_threads(teacher.torch_threads):
        source = start / owner
        model = AutoModelForCausalLM.from_pretrained(str(source))
        parts, counts = {}, {}
        for role in roles:  # the same sequences stage 2 builds for each role's own model
            parts[role], counts[role] = _role_sequences(tokenizer, chats[role], role, cfg)
        validation = {role: sft_sequences(tokenizer, held.get(role, []), role=role, noise=0.0, rng=random.Random(0),
                                          max_seq_tokens=cfg.max_seq_tokens)[0] for role in roles}
        before = _validate(model, validation, pad_id)
        mix = RoleMix(parts, epochs, seed=cfg.seed)
        metrics = sft_train(model, _relabeled(mix, scenario, tokenizer, cfg), sft, pad_id=pad_id,
                            desc=f"shared teacher stage {'+'.join(roles)}", progress=progress, epochs=1.0)
        metrics["validation_before"] = before
        metrics["validation"] = _validate(model, validation, pad_id)
    _save_folder(model, tokenizer, source, target)
    steps = int(metrics.get("steps", 0))
    oracle_steps = {role: _steps_of(start / role) or 0 for role in roles}
    budget = {"oracle_stage_steps": oracle_steps[owner], "teacher_stage_steps": steps,
              "total_steps": oracle_steps[owner] + steps, "batch_tokens": cfg.batch_tokens, "role_epochs": epochs,
              "shown": mix.shown(), "per_role_oracle_stage_steps": oracle_steps}
    record = {"key": key, "counts": counts, "teacher": seen, "metrics": metrics, "budget": budget, "from": str(source),
              "roles": list(roles)}
    record_file.write_text(strict_json.dumps(record, indent=2, default=str) + "\n")
    return target


def _teacher_of(cfg: WarmStartConfig) -> Any:
    """The stage's teacher (``cfg.teacher``); refused when it makes no mistake (the stage would be the oracle)."""
    if not cfg.teacher.enabled:
        raise ValueError("warm_start.teacher has no mistake with a rate above 0: the second stage would be the oracle again")
    return cfg.teacher


def _stage_sft(cfg: WarmStartConfig) -> WarmStartConfig:
    """The stage's fine-tuning settings: the teacher's learning rate and schedule, no noise, no validation split."""
    teacher = cfg.teacher
    return replace(cfg, lr=teacher.lr, warmup_steps=teacher.warmup_steps, min_lr_ratio=teacher.min_lr_ratio,
                   noise=0.0, validation_tasks=0)


def _role_sequences(tokenizer: Any, chats: Sequence[Any], role: str, cfg: WarmStartConfig) -> tuple[list[Any], Any]:
    """A role's training sequences from its teacher chats (seeded by the stage seed and the role)."""
    return sft_sequences(tokenizer, chats, role=role, noise=0.0, rng=random.Random(f"teacher-{cfg.seed}-{role}"),
                         max_seq_tokens=cfg.max_seq_tokens)


def _relabeled(sequences: Sequence[tuple[list[int], list[int]]], scenario: Any, tokenizer: Any,
               cfg: WarmStartConfig) -> Sequence[tuple[list[int], list[int]]]:
    """``sequences`` as shown to the model: relabelled (``cfg.relabel``) or as they are."""
    return Relabeled(sequences, token_groups(scenario, tokenizer), seed=cfg.seed) if cfg.relabel else sequences


def _save_folder(model: Any, tokenizer: Any, source: Path, target: Path) -> None:
    """``target`` replaced by the model and tokenizer, with the source's generation config and chat template."""
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    for name in ("generation_config.json", "chat_template.jinja"):
        if (source / name).is_file() and not (target / name).is_file():
            shutil.copy2(source / name, target / name)
