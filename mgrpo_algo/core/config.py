"""The one typed config tree of a run (``TrainConfig``), loaded from YAML with ``--set`` overrides.

One docstring per field: default, trade-off, the paper's value. Each dataclass checks its fields (and
fields against each other) in ``__post_init__`` and raises ``ValueError`` naming the offending field,
and every field that names something registered (mode, estimators, policy loss, aggregation,
alignment strategy, placement, store) is checked against its registry when the config loads, with
its dotted path (``config_types.check_names``), so a bad YAML file or ``--set`` fails before any
model loads. Split by concern: a role's sections are in ``config_role``, the placement and the
judge in ``config_services``, the held-out evaluation and the CPU kernels in ``config_run``, the modes in
``modes``; all are importable from here.
"""

from __future__ import annotations

import math
import typing
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

from mgrpo_env.align import OUTCOME_GROUPS
from mgrpo_env.core import EXPERT_REFERENCES, Limits
from mgrpo_env.rewards import PAPER_MAIN_WEIGHTS, PAPER_SUB_WEIGHTS
from mgrpo_env.roles import ROLES

from .config_role import (
    AUTOCAST_DTYPES,
    DEVICE_TYPES,
    DTYPES,
    CalledSideConfig,
    GenerationConfig,
    LearnerConfig,
    RoleConfig,
    ServedConfig,
)
from .config_run import EvalConfig, KernelsConfig
from .config_services import JudgeConfig, PlacementConfig
from .config_types import check as _check
from .config_types import check_names, check_own_names, named
from .config_types import coerce as _coerce
from .modes import MODES, ModeSpec
from .teacher_config import TeacherConfig

__all__ = [
    "LearnerConfig",
    "AUTOCAST_DTYPES",
    "DTYPES",
    "EvalConfig",
    "KernelsConfig",
    "GenerationConfig",
    "JudgeConfig",
    "Limits",
    "PlacementConfig",
    "ServedConfig",
    "RoleConfig",
    "StageConfig",
    "TrainConfig",
    "MODES",
    "ModeSpec",
    "WarmStartConfig",
    "load_config",
    "config_to_dict",
]

@dataclass
class StageConfig:
    """One curriculum stage (paper: stage 1 simple questions to learn the format, stage 2 multi-hop)."""

    split: str = "stage2/train"
    """The split whose training questions this stage draws (a name of ``scenario.splits()``); several
    joined with ``+`` (``stage1/train+stage2/train``) mix them: each batch draws from their union."""
    iterations: int = 2
    """Iterations of B questions x K rollouts in this stage (0: the stage is skipped)."""

    def __post_init__(self) -> None:
        _check(self.iterations >= 0, "stages.iterations", "must be >= 0")


@dataclass
class WarmStartConfig:
    """Supervised warm start from oracle demonstrations."""

    splits: list[str] = field(default_factory=lambda: ["stage1/train", "stage2/train"])
    """Splits whose train tasks are demonstrated (the paper's stage 1 is simple questions)."""
    max_tasks: int = 200
    """Tasks demonstrated per split (the oracle solves each once)."""
    epochs: int = 3
    """Passes over the demonstrations. 0 disables the warm start."""
    lr: float = 1e-3
    """AdamW learning rate for the tiny from-scratch models (3e-3 diverged to NaN in the sweep of
    benchmarks/warm_start_sweep.py; 1e-3 learned fastest)."""
    batch_tokens: int = 8192
    """Padded tokens per optimiser step."""
    noise: float = 0.2
    """Share of demonstrated actions replaced by random well-formed protocol actions (0 = pure oracle)."""
    max_seq_tokens: int = 3072
    """Longer demonstrations are skipped (counted in the metrics)."""
    warmup_steps: int = 0
    """Linear learning-rate warmup over the first steps (small models trained from scratch: 50-100,
    nanoGPT's small configs; without it lr 3e-3 diverged in the sweep)."""
    min_lr_ratio: float = 1.0
    """Cosine decay from ``lr`` to ``lr * min_lr_ratio`` over all steps after the warmup (1.0 = constant lr)."""
    beta2: float = 0.999
    """AdamW's second-moment decay (0.99 for small models and short runs, as nanoGPT's small configs)."""
    relabel: bool = False
    """Relabel world tokens at random in every demonstration each time it is shown (consistently
    within it: a name becomes another name everywhere, its slug follows), from the scenario's
    ``world_token_groups()`` (the wiki-hops tiny profile). Every copy stays a copy, but a name can no
    longer be answered from memory, so the model must learn to copy, and a few hundred demonstrations
    become an endless supply of fresh ones (in-context copying is learned from many rare items,
    not from a few frequent ones: Chan et al. 2022, Reddy 2023)."""
    role_epochs: dict[str, float] = field(default_factory=dict)
    """Per-role epochs overriding ``epochs`` (e.g. ``{main: 6, sub: 3}``): the roles' demonstrations
    differ in length and difficulty, so equal epochs are not equal budgets. Fractions train on a
    share of the last epoch."""
    device: str = "cpu"
    """Where the warm start trains ("cuda": bf16 autocast); the models are saved back as float32."""
    torch_threads: int = 2
    """CPU threads for the warm start's large batches (2 threads: 1.4x the tokens/s of 1 for
    8,000-token batches on the 2-core machine; nothing else runs meanwhile)."""
    validation_tasks: int = 16
    """The last tasks of each split are held out of training; the warm-started model's turn exact
    match on their demonstrations is recorded in ``warm_start.json`` (0: no validation)."""
    seed: int = 0
    """Seeds the warm start's noise, shuffles and relabelling (part of its cache key)."""
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    """Second stage: imitate an imperfect teacher (off when all its rates are 0; see TeacherConfig)."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.noise <= 1.0:
            raise ValueError(f"config field 'warm_start.noise' must be in [0, 1], got {self.noise}")
        if self.validation_tasks < 0:
            raise ValueError(f"config field 'warm_start.validation_tasks' must be >= 0, got {self.validation_tasks}")
        if not isinstance(self.device, str) or self.device.split(":")[0] not in DEVICE_TYPES:
            raise ValueError(f"config field 'warm_start.device' must be a torch device string "
                             f"({', '.join(DEVICE_TYPES)}), got {self.device!r}")
        if self.epochs < 0 or self.max_tasks < 1 or self.batch_tokens < 64:
            raise ValueError("config fields 'warm_start.epochs' >= 0, 'max_tasks' >= 1, 'batch_tokens' >= 64")
        if self.warmup_steps < 0 or not 0.0 <= self.min_lr_ratio <= 1.0 or not 0.0 < self.beta2 < 1.0:
            raise ValueError("config fields 'warm_start.warmup_steps' >= 0, 'min_lr_ratio' in [0, 1], 'beta2' in (0, 1)")
        bad = {r: e for r, e in self.role_epochs.items() if r not in ROLES or not e >= 0}
        if bad:
            raise ValueError(f"config field 'warm_start.role_epochs' takes roles main/sub/single with epochs >= 0, got {bad}")

    def epochs_for(self, role: str) -> float:
        """The epochs of ``role``: its ``role_epochs`` entry, else ``epochs``."""
        return float(self.role_epochs.get(role, self.epochs))


@dataclass
class TrainConfig:
    """A whole training run. Load with :func:`load_config` (YAML + ``key.sub=value`` overrides)."""

    mode: str = named("mgrpo", "mgrpo_algo.core.modes:MODES")
    """A name in ``mgrpo_algo.core.modes.MODES``. ``mgrpo``: main and sub learners both update (the
    paper's method). ``frozen-sub``: only the main learner updates (baseline). ``single-agent``: GRPO
    on the single-agent env (baseline)."""
    scenario: str = "wiki-hops"
    """The scenario's registered name (``mgrpo_scenarios.names()``: wiki-hops, qa-file, gaia, ...)."""
    scenario_kwargs: dict[str, Any] = field(default_factory=dict)
    """Passed to ``mgrpo_scenarios.get`` (e.g. ``num_entities``, ``seed``, ``data_dir``)."""
    stages: list[StageConfig] = field(
        default_factory=lambda: [StageConfig("stage1/train", 1), StageConfig("stage2/train", 1)]
    )
    """The curriculum, run in order (:class:`StageConfig`: split and iterations each)."""
    questions_per_iteration: int = 4
    """B, questions per iteration. Each gets K rollouts."""
    group_size: int = 4
    """K, rollouts per question (paper: 8). Advantages are relative within this group."""
    align_d: int = 0
    """Alignment width d (paper: 8). 0: chosen from the sub-agent counts seen so far as the smallest
    d with P(d_k <= d) >= align_quantile."""
    align_quantile: float = 0.99
    """With ``align_d`` 0: d is the smallest width that covers this share of the sub-agent counts seen."""
    align_strategy: str = named("duplicate", "mgrpo_env.align:STRATEGIES")
    """``duplicate`` (paper), ``duplicate_balanced`` or ``mask`` (pad with weight-0 slots)."""
    step_advantage_weight: float = 0.0
    """w of step-level credit (GiGPO, arXiv 2505.10978), for every role and every mode alike: a turn's
    advantage is its trajectory's plus w x its step advantage, the return standardised among the
    turns of the query's rollouts that start from the same state (``core.advantages.step_advantages``).
    It credits the action taken where a group's rollouts diverge, not the whole trajectory: the
    main agent is no longer blamed, at the turns before, for a sub-agent's wrong report. 0 (the
    paper): one advantage per trajectory. GiGPO uses 1."""
    turn_format_penalty: float = 0.0
    """c of a turn-level format penalty, for every trained role and every mode alike: each malformed turn,
    and the last turn of an agent that ended without its result or answer (a turn limit), carries its
    advantage minus c on its own tokens, outside the group standardisation
    (``mgrpo_algo.core.scoring.TurnCredit``). The rest of the trajectory is untouched, so no well-formed
    guess gains from it. 0: the paper (a malformed trajectory only loses its outcome reward)."""
    success_likelihood: float = 0.0
    """lam of a likelihood regulariser on successful trajectories: every sampled token of a correct main
    (or single) trajectory, and of a sub-agent's report in proportion to its expert score, carries its
    advantage plus lam; under the single on-policy step (``ppo_epochs`` = ``minibatches`` = 1) exactly
    lam x their negative log-likelihood added to the loss (arXiv 2512.04220: GRPO in multi-turn search
    collapses as the likelihood of correct trajectories falls). No supervised data: the policy's own
    successes. 0: the paper."""
    delegation_credit: float = 0.0
    """w_d of a judged delegation credit for the main agent, the analogue of the sub-agents' expert score:
    each of its delegating turns carries its advantage plus w_d when it asks a hop the task still needs
    (the hop's question about the name the question gives or a sub-agent reported) and minus w_d when it
    does not, on that turn's own tokens, outside the group standardisation
    (``mgrpo_algo.core.scoring.TurnCredit``, ``mgrpo_env.attribution.delegation_judgements``). Needs a
    scenario whose tasks carry gold hops and that declares ``mgrpo_scenarios.AttributesDelegations``
    (refused at load otherwise). 0: the paper."""
    sub_outcome_groups: str = "query"
    """How the sub-agents' outcome term A_S is grouped: "query" (the paper: pooled over the query's d x K
    aligned slots) or "subtask" (per delegated subtask within the query, so a sub-agent is compared with
    those given the same subtask; a subtask only one slot holds keeps its pooled A_S)."""
    main_estimator: str = named("grpo", "mgrpo_algo.core.advantages:ESTIMATORS")
    """The main (and single) agent's advantage estimator, by its name in
    ``mgrpo_algo.core.advantages.ESTIMATORS``: "grpo" (the paper: standardised over the K rollouts)."""
    sub_estimator: str = named("grpo_pooled_masked", "mgrpo_algo.core.advantages:ESTIMATORS")
    """The sub-agents' estimator over the aligned [Q, K, d] slots, by name: "grpo_pooled_masked" (the
    paper: pooled per query over its unmasked slots). A new estimator is one registered function."""
    main_weights: tuple[float, float] = PAPER_MAIN_WEIGHTS
    """(a1, a2) of R_M; the paper's by default (``mgrpo_env.rewards.PAPER_MAIN_WEIGHTS``)."""
    sub_weights: tuple[float, float, float] = PAPER_SUB_WEIGHTS
    """(b1, b2, b3) of R_S; the paper's by default (``mgrpo_env.rewards.PAPER_SUB_WEIGHTS``)."""
    sub_format_gate: bool = False
    """Pay the sub-agents' format term in proportion to the expert score (b1 * r_format * r_expert), so
    a well-formed wrong report earns nothing for its form. False: the paper. Under the paper's R_S
    the sub-agents learned to report guesses (docs/results/demo.md, "Rewards that do not pay guessing")."""
    reward_terms: dict[str, dict[str, float]] = field(default_factory=dict)
    """Extra reward terms per role, ``{role: {term: weight}}``: each a name registered in
    ``mgrpo_env.rewards.REWARD_TERMS`` (before the config loads), paid as ``weight x term(inputs)`` on a
    well-formed trajectory on top of the role's pay, by the env and by the role's worker alike
    (``examples/extend/new_reward_term.py``). Empty: the paper's rewards."""
    expert_reference: str = "hop"
    """What r_expert scores a report against: "hop" (the paper: the gold answer of the question's hop)
    or "subtask" (the scenario's answer to the subtask the main agent actually delegated, so a
    sub-agent is not blamed for a mis-delegation). A scenario without ``subtask_answer`` is refused when the
    config loads; a subtask the scenario cannot answer is scored against the hop, counted in
    ``sub/expert_fell_back`` (its ``expert_source``: ``subtask>hops``)."""
    tools: dict[str, list[str]] = field(default_factory=dict)
    """Each role's tools by name, e.g. ``{main: [delegate], sub: [search, visit]}`` (the names in
    ``mgrpo_env.protocol.TOOLS``, a registered tool's included; the main agent only ``delegate`` and
    ``reason``, the env's own, and tools registered for it). A role not named keeps the scenario's set (default: main delegate,
    reason; sub and single search, visit, click). Checked when the config loads; the envs of training
    and evaluation get it, and so do the warm start's demonstrations (``mgrpo warm-start`` with the same
    config shows its start models these tools; a prebuilt start model saw its own warm start's tools:
    keep them alike, or ``mgrpo train`` / ``compare`` warn)."""
    limits: Limits = field(default_factory=Limits)
    """Episode limits, the env's own :class:`mgrpo_env.Limits` (defaults there); both envs take this
    object (the single agent's turn budget is its ``single_agent_turns``)."""
    expert_judge: JudgeConfig = field(default_factory=JudgeConfig)
    """An LLM judge for r_expert on tasks without per-hop gold (:class:`JudgeConfig`); honoured by
    every placement."""
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    """Where the roles run and, decoupled, the store and the staleness (:class:`PlacementConfig`)."""
    models_dir: str = "runs/models"
    """Where tiny role models are built when a role's ``model`` is empty."""
    model_sizes: dict[str, dict[str, int]] = field(default_factory=dict)
    """Tiny model sizes per role (``hidden_size``, ``num_layers``, ...); see models.build_role_models."""
    main: RoleConfig = field(default_factory=RoleConfig)
    sub: RoleConfig = field(default_factory=RoleConfig)
    single: RoleConfig = field(default_factory=RoleConfig)
    roles: dict[str, RoleConfig] = field(default_factory=dict)
    """The table of roles, by name: a role registered with ``mgrpo_env.roles.register_role`` (e.g.
    ``{verifier: {model: ..., learner: {lr: ...}}}``), read like ``main``/``sub``/``single`` through
    :meth:`role`; ``main``, ``sub`` and ``single`` may be given here too (``roles: {main: {model: ...}}``
    loads as the ``main:`` section; both at once is refused). A name must be registered before the config
    loads."""
    out_dir: str = "runs/train"
    """The run folder: metrics.jsonl, episodes.jsonl, checkpoints/, final/, tb/ (a used one is refused)."""
    seed: int = 0
    """The RL seed: question order, sampling, minibatch shuffles; ``mgrpo eval``'s episode and sampling seed."""
    model_seed: int = 0
    """Initialisation of the tiny models built under ``models_dir`` (kept apart from ``seed`` so that
    runs with other RL seeds share the same models and warm start)."""
    torch_threads: int = 1
    """CPU threads for torch. Tiny models are overhead-bound: 1 thread is fastest on a shared 2-core
    machine (measured up to 50x faster than 2 under contention)."""
    max_workers: int = 8
    """Threads stepping envs (tool calls) during collection."""
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    """Supervised stage-1 warm start from oracle demonstrations (``epochs: 0`` disables it). Runs
    before RL when the roles use the built tiny models; cached under ``models_dir``."""
    checkpoint: bool = True
    """Save each learner (safetensors + optimizer + RNG) at the end of every stage under
    ``checkpoints/stage<n>/<role>``. The per-iteration checkpoints of the commit protocol
    (``workers/<role>/checkpoints/iter-<t>``, only the last committed one kept) are always written:
    a restarted worker and ``resume`` need them."""
    keep_token_ids: bool = False
    """Keep every applied iteration's sampled token ids (prompt, completion, log-probabilities) in each
    role worker's ``workers/<role>/trajectories/<t>.json``, keyed by the episode records'
    ``trajectory_key``. False: a worker deletes an iteration's tokens once it has applied it (the
    records keep text and rewards only, under every placement)."""
    resume: bool = False
    """Continue the run in ``out_dir`` after its last committed iteration (``loop_state.json``; every
    role worker goes back to its checkpoint of that iteration), dropping metrics and episodes lines
    written after it. Any placement. False: a fresh run (earlier worker state in ``out_dir`` is removed)."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Held-out evaluation (``mgrpo compare``): split, questions, greedy or sampled, curve points."""
    kernels: KernelsConfig = field(default_factory=KernelsConfig)
    """CPU kernels (:class:`KernelsConfig`): the fastest for this CPU, or pinned so that figures reproduce
    on one vendor's x86 machines."""

    def __post_init__(self) -> None:
        check_own_names(self, "")
        _check(self.questions_per_iteration >= 1, "questions_per_iteration", "must be >= 1")
        _check(self.group_size >= 2, "group_size", "must be >= 2 (advantages are relative to the group)")
        _check(self.align_d >= 0, "align_d", "must be >= 0 (0 = choose from data)")
        _check(0 < self.align_quantile <= 1, "align_quantile", "must be in (0, 1]")
        _check(len(self.main_weights) == 2, "main_weights", "needs 2 values (a1, a2)")
        _check(self.step_advantage_weight >= 0, "step_advantage_weight", "must be >= 0")
        for name in ("turn_format_penalty", "success_likelihood", "delegation_credit"):
            value = getattr(self, name)
            _check(isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0,
                   name, f"must be a finite number >= 0, got {value!r}")
        _check(self.sub_outcome_groups in OUTCOME_GROUPS, "sub_outcome_groups",
               f"must be one of {OUTCOME_GROUPS}, got {self.sub_outcome_groups!r}")
        _check(len(self.sub_weights) == 3, "sub_weights", "needs 3 values (b1, b2, b3)")
        _check(self.expert_reference in EXPERT_REFERENCES, "expert_reference",
               f"must be one of {EXPERT_REFERENCES}, got {self.expert_reference!r}")
        if self.expert_reference == "subtask":  # refused here, not paid as 'hop' in silence (issue 53)
            from mgrpo_scenarios import answers_subtasks

            _check(answers_subtasks(self.scenario) is not False, "expert_reference",
                   f"'subtask' needs a scenario that answers subtasks (subtask_answer); {self.scenario!r} has none: use 'hop'")
        _check(self.torch_threads >= 1, "torch_threads", "must be >= 1")
        from mgrpo_env.protocol import check_tool_names
        from mgrpo_env.roles import ROLE_TABLE

        for role in self.roles:
            _check(role in ROLE_TABLE and role not in ROLES, "roles",
                   f"names registered roles other than {ROLES} (registered: {tuple(ROLE_TABLE)}), got {role!r}")
        from mgrpo_env.rewards import REWARD_TERMS

        for role, terms in self.reward_terms.items():
            _check(role in ROLE_TABLE, "reward_terms", f"names roles of {tuple(ROLE_TABLE)}, got {role!r}")
            _check(isinstance(terms, dict), f"reward_terms.{role}", f"must map term names to weights, got {terms!r}")
            for name, weight in terms.items():
                REWARD_TERMS.check(name, f"reward_terms.{role}.{name}")
                _check(isinstance(weight, (int, float)) and not isinstance(weight, bool) and math.isfinite(weight),
                       f"reward_terms.{role}.{name}", f"must be a finite number, got {weight!r}")
        for role in ROLES:  # the built-in roles score by the run's main_* / sub_* fields
            _check(self.role(role).called == CalledSideConfig(), f"{role}.called",
                   f"is for a registered called role; {role} scores by the run's "
                   f"{'sub_*' if role == 'sub' else 'main_*'} fields")
        for role, section in self.roles.items():
            inherited = {k: v for k, v in self._sub_side().items() if k not in section.called.given()}
            if ROLE_TABLE[role].called_by and inherited:  # said when the config loads: scored like the sub-agents
                warnings.warn(f"config field 'roles.{role}.called': {', '.join(inherited)} not set: role {role!r} "
                              f"scores its side with the sub-agents' ({', '.join(f'{k} {v!r}' for k, v in inherited.items())})",
                              UserWarning, stacklevel=2)
        for role, names in self.tools.items():
            _check(role in ROLE_TABLE, "tools", f"names roles of {tuple(ROLE_TABLE)}, got {role!r}")
            check_tool_names(role, names, where=f"config field 'tools.{role}'")
        for role in self.model_sizes:  # a misspelled role would build its model at the default size
            _check(role in ROLES, "model_sizes", f"names roles of {ROLES}, got {role!r}")
        _check(bool(self.stages), "stages", "needs at least one stage")
        served = [r for r in (*ROLES, *self.roles) if self.role(r).served.enabled]
        _check(not served or self.placement.in_process, "placement.kind",
               f"must be local (workers in this process) for served engines (roles {served})")
        from .losses import get_policy_loss  # each role's loss options, with their dotted path

        for role in (*ROLES, *self.roles):
            learner = self.role(role).learner
            where = f"{role}.learner" if role in ROLES else f"roles.{role}.learner"
            get_policy_loss(learner.policy_loss).make_options(learner, where)

    def called_side(self, role: str) -> tuple[tuple[float, ...], bool, str, str]:
        """How the called ``role`` scores its side: (its reward's weights, format gate, advantage estimator,
        outcome grouping): the sub-agents' are the run's ``sub_*`` fields; a registered role's are its
        ``roles.<name>.called`` section, each unset one the sub-agents' (said when the config loads)."""
        # a role without a section (a mode that lists it fails for its model first) scores as the sub-agents
        side = {**self._sub_side(), **(self.roles[role].called.given() if role in self.roles else {})}
        return (tuple(float(w) for w in side["weights"]), side["format_gate"], side["estimator"], side["outcome_groups"])

    def _sub_side(self) -> dict[str, Any]:
        """How the sub-agents score their side: the run's ``sub_*`` fields, by ``CalledSideConfig``'s names."""
        return {"weights": list(self.sub_weights), "format_gate": self.sub_format_gate,
                "estimator": self.sub_estimator, "outcome_groups": self.sub_outcome_groups}

    def role_terms(self, role: str) -> tuple[tuple[str, float], ...]:
        """``role``'s extra reward terms ((name, weight) pairs, in the config's order; () for none)."""
        return tuple((name, float(weight)) for name, weight in self.reward_terms.get(role, {}).items())

    def role(self, name: str) -> RoleConfig:
        """The section of role ``name``: ``main``, ``sub``, ``single``, or its entry in :attr:`roles`."""
        if name in ROLES:
            return getattr(self, name)
        if name not in self.roles:
            raise ValueError(f"config field 'roles.{name}' is needed: role {name!r} has no section in the run config")
        return self.roles[name]


def load_config(path: str | None = None, overrides: Sequence[str] = ()) -> TrainConfig:
    """A TrainConfig from YAML (``path``) with ``dotted.key=value`` overrides (values parsed as YAML).

    Unknown keys raise ValueError naming the field, so a typo never passes silently.
    """
    import yaml

    data: dict[str, Any] = {}
    if path:
        loaded = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"{path}: a config file must hold a mapping")
        data = loaded
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"override {item!r} is not key=value")
        node = data
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"override {item!r}: '{part}' is not a section")
        node[parts[-1]] = yaml.safe_load(value)
    return _build(TrainConfig, _builtin_roles_out_of_the_table(data), "")


def _builtin_roles_out_of_the_table(data: dict[str, Any]) -> dict[str, Any]:
    """``roles:`` is the config's one table of roles: ``roles: {main: {...}}`` is the ``main:`` section (as
    are ``sub`` and ``single``), so a config may hold every role in the table; giving a built-in role in
    both places is refused (which would win is not for the loader to guess)."""
    table = data.get("roles")
    if not isinstance(table, dict) or not set(table) & set(ROLES):
        return data
    data = {**data, "roles": {k: v for k, v in table.items() if k not in ROLES}}
    for role in ROLES:
        if role in table:
            if role in data:
                raise ValueError(f"config field 'roles.{role}': role {role!r} is also given as the section '{role}'; "
                                 "give it once")
            data[role] = table[role] if table[role] is not None else {}
    return data


def _build(cls: Any, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        names = ", ".join(f.name for f in fields(cls))
        raise ValueError(f"config field '{where.rstrip('.') or cls.__name__}' must be a mapping (a section: {names}), got {data!r}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"unknown config field '{where + unknown[0]}' (valid: {', '.join(sorted(names))})")
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        hint = hints[name]
        if isinstance(hint, type) and is_dataclass(hint):
            kwargs[name] = _build(hint, value, f"{where}{name}.")
        elif typing.get_origin(hint) is dict and is_dataclass(typing.get_args(hint)[1]):
            item_cls = typing.get_args(hint)[1]
            if not isinstance(value, dict):
                raise ValueError(f"config field '{where}{name}' must be a mapping of sections by name, got {value!r}")
            kwargs[name] = {str(k): _build(item_cls, v or {}, f"{where}{name}.{k}.") for k, v in value.items()}
        elif typing.get_origin(hint) is list and is_dataclass(typing.get_args(hint)[0]):
            item_cls = typing.get_args(hint)[0]
            kwargs[name] = [_build(item_cls, v, f"{where}{name}[{i}].") for i, v in enumerate(value or [])]
        else:
            kwargs[name] = _coerce(hint, value, where + name)
    kwargs = check_names(cls, kwargs, where)  # every registered name, with its dotted path
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ValueError(f"config section '{where or cls.__name__}': {exc}") from None


def config_to_dict(config: Any) -> dict[str, Any]:
    """A plain dict (for YAML/JSON dumps and run manifests)."""
    return asdict(config)
